"""The pull-request preview, for the reviewers of a release: ``release push --dry-run --preview DIR`` (the plan of a
committed release manifest against the Hub) and ``release card --preview DIR --base DIST`` (the cards alone, against
the base commit's); each writes the comment (under GitHub's limit, the card diffs inline and collapsed), the full
plan or diff and the cards of each repo."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from release import __version__
from release.check.report import CARD_FILES, matches
from release.core.builds import load_release
from release.core.config import ReleaseConfig
from release.core.errors import ReleaseError
from release.core.files import plain_files
from release.core.io import atomic_dir, atomic_write, replaceable_folder
from release.publish.plan import RepoPlan, hub_endpoint, human_size, remote_label, render_plan, repo_status
from release.publish.request import PushRequest

COMMENT_LIMIT = 65_536  # GitHub's limit on the body of a comment, in characters
COMMENT_BUDGET = COMMENT_LIMIT - 1_024  # what --preview's comment.md may use: the rest is the posting job's link
COMMENT_MARKER = "<!-- release-push-preview -->"  # the posting job updates the comment that starts with it
CARD_PREVIEW = frozenset({"comment.md", "cards.diff", "cards"})  # what card --preview writes
DIFF_FLOOR = 1_500  # the least room worth a diff inline: below it the comment points to the artifact instead


def _units(text: str) -> int:
    """The length of ``text`` as JavaScript and GitHub count it (UTF-16 code units: at least its characters)."""
    return len(text.encode("utf-16-le")) // 2


def _take(text: str, items: list[str], room: int) -> tuple[str, int]:
    """``text`` with as many of ``items`` appended, each on a line, as fit in ``room``; and how many did not."""
    for i, item in enumerate(items):
        if _units(text) + 1 + _units(item) > room:
            return text, len(items) - i
        text += "\n" + item
    return text, 0


def _diff_stat(diff: str) -> str:
    lines = diff.splitlines()[2:]  # after the ---/+++ header
    return f"+{sum(1 for x in lines if x.startswith('+'))} -{sum(1 for x in lines if x.startswith('-'))}"


def _fenced(diff: str, room: int) -> str:
    """``diff`` as a ```diff block of at most ``room`` units, cut after a whole line (the artifact has it all); the
    fence is longer than any run of backticks inside (the cards' own code blocks)."""
    fence = "`" * max(3, 1 + max(map(len, re.findall(r"`+", diff)), default=0))
    shown, left = _take(f"{fence}diff", diff.splitlines(), room - _units(fence) - 80)  # 80: the fence and the note
    cut = f"\n\n({left} more lines of this diff are in the artifact.)" if left else ""
    return f"{shown}\n{fence}{cut}"


Block = tuple[str, list[str], str]  # a collapsed block: its summary, the lines it always shows, a diff to show inline


def _collapsed(block: Block, room: int) -> str:
    """``block`` in a <details>, its diff inline in ``room`` units, or a pointer when that holds neither the whole diff
    nor DIFF_FLOOR of it."""
    summary, body, diff = block
    if diff:
        inline = room >= min(DIFF_FLOOR, _units(diff) + 100)  # whole, or at least DIFF_FLOOR of it
        shown = _fenced(diff, room) if inline else "(The diff is in the artifact: no room is left for it here.)"
        body = [*body, "", shown] if body else [shown]
    return "\n".join([f"<details><summary>{summary}</summary>", "", *body, "", "</details>", ""])


def _shares(sizes: list[int], room: int) -> list[int]:
    """``room`` shared among ``sizes`` (in their order): the smallest get what they need, the rest share equally."""
    caps = [0] * len(sizes)
    for k, i in enumerate(sorted(range(len(sizes)), key=sizes.__getitem__)):
        caps[i] = min(sizes[i], room // (len(sizes) - k))
        room -= caps[i]
    return caps


def _take_blocks(text: str, blocks: list[Block], room: int) -> tuple[str, int]:
    """``text`` with the collapsed ``blocks`` that fit in ``room``: each block's lines first, then what is left
    shared among their diffs (so every block fits whenever its lines do); and how many did not fit."""
    free = room - _units(text) - sum(_units(_collapsed(b, 0)) + 1 for b in blocks)
    caps = _shares([_units(b[2]) + 100 if b[2] else 0 for b in blocks], max(0, free - 100 * len(blocks)))
    return _take(text, [_collapsed(b, cap) for b, cap in zip(blocks, caps, strict=True)], room)


def _details(p: RepoPlan) -> Block:
    """One repo's changes, collapsed: the commit, the changed files and the README's diff against the remote."""
    counts = ", ".join(f"{n} to {a}" for a in ("add", "modify", "delete") if (n := p.counts[a]))
    stat = f"; README.md {_diff_stat(p.readme_diff)}" if p.readme_diff else ""
    parent = f" on `{p.head[:12]}`" if p.head else ""
    lines = [f"Commit `{p.commit_message}`{parent}.", "", "| file | action | size | storage |", "|---|---|---:|---|"]
    lines += [f"| `{f.path}` | {f.action} | {human_size(f.size)} | {f.storage} |" for f in p.changes]
    return f"<code>{p.repo_id}</code> ({p.build}): {counts}{stat}", lines, p.readme_diff


def render_comment(plans: list[RepoPlan], request: PushRequest) -> str:
    """The pull-request comment: one summary row per repo, each repo's changes collapsed. At most COMMENT_BUDGET
    characters: what does not fit is left out with a pointer to the full plan in the workflow's artifact."""
    where = f"`{request.lock_path}` (a real build's manifest)" if request.lock_path else f"`{request.dist}`"
    changing = [p for p in plans if p.changes]
    head = [COMMENT_MARKER, f"### Release preview: release {request.release.version} to {request.org}", "",
            f"Planned read-only from {where} against {remote_label(request)} by "
            f"`release` {__version__}: {len(plans)} repos, {len(changing)} with changes, "
            f"{sum(1 for p in plans if not p.exists)} to create.", "",
            "| repo | build | status | add | modify | delete | unchanged | upload | tag |",
            "|---|---|---|--:|--:|--:|--:|--:|---|"]
    rows = []
    for p in plans:
        n = p.counts
        tag = {"create": "create", "move": "move (--retag)", "unchanged": "unchanged", "none": "-"}[p.tag_action]
        rows.append(f"| `{p.repo_id}` | {p.build} | {repo_status(p, request)} | {n['add']} | {n['modify']} | "
                    f"{n['delete']} | {n['unchanged']} | {human_size(p.upload_bytes)} | {tag} |")
    footer = "\nThe full plan (`plan.md`, `plan.json`: README diffs and the commit description) and the cards " \
        "rendered in every language, with their plots (`cards/`), are in this run's artifact."
    return _fitted(head, rows, [_details(p) for p in changing], footer,
                   ("{n} more repos and every repo's details are", "The details of {n} more repos are"))


def _fitted(head: list[str], rows: list[str], blocks: list[Block], footer: str, notes: tuple[str, str]) -> str:
    """``head``, as many ``rows`` as fit, then (if every row did) the collapsed ``blocks`` that fit, then ``footer``:
    at most COMMENT_BUDGET units. ``notes``: what was left out, rows or blocks (``{n}``: how many)."""
    room = COMMENT_BUDGET - _units(footer) - 200  # 200: the note on what was left out
    text, rows_left = _take("\n".join(head), rows, room)
    if rows_left:
        text += f"\n\n{notes[0].format(n=rows_left)} left out here to stay under GitHub's comment limit."
    else:
        text, blocks_left = _take_blocks(text + "\n", blocks, room)
        if blocks_left:
            text += f"\n{notes[1].format(n=blocks_left)} left out here to stay under GitHub's comment limit."
    return text + "\n" + footer + "\n"


def write_preview(out: Path, plans: list[RepoPlan], request: PushRequest, dist: Path) -> None:
    """``out``: ``comment.md`` (``render_comment``), the full plan as ``plan.md`` and ``plan.json``, and the card
    files of each repo under ``cards/REPO/``; written aside and put in place whole."""
    with atomic_dir(out) as tmp:
        atomic_write(tmp / "comment.md", render_comment(plans, request))
        atomic_write(tmp / "plan.md", render_plan(plans, request, "text") + "\n")
        atomic_write(tmp / "plan.json", render_plan(plans, request, "json") + "\n")
        for build in request.builds:
            for rel in plain_files(dist / build.repo):
                if matches(rel, CARD_FILES):
                    atomic_write(tmp / "cards" / build.repo / rel, (dist / build.repo / rel).read_bytes())


@dataclass(frozen=True)
class CardPreviewRequest:
    """``release card --preview DIR --base DIST``: the cards rendered in ``dist`` against those rendered in ``base``
    (the base commit's, by its own code), without the Hub: what a pull request changes in the cards' text."""

    release: ReleaseConfig
    dist: Path
    base: Path | None
    out: Path
    note: str

    @classmethod
    def create(cls, dist: Path, out: Path | None, base: Path | None, note: str,
               check: bool) -> CardPreviewRequest | None:
        """The request, or None without --preview (then --base and --note are refused: they would do nothing)."""
        if out is None:
            if base is not None or note:
                raise ReleaseError(f"{'--base' if base is not None else '--note'}: only with --preview DIR (the "
                                   "pull-request preview of the cards); add --preview or drop it")
            return None
        if check:
            raise ReleaseError("--preview with --check: --check writes nothing; drop one of them")
        if base is not None and not base.is_dir():
            raise ReleaseError(f"--base {base}: not a folder; give the dist whose cards the base commit rendered, or "
                               "leave --base out (the preview then lists the cards without a diff)")
        return cls(load_release(), dist, base, replaceable_folder(out, "--preview", CARD_PREVIEW), note)


@dataclass(frozen=True)
class CardChange:
    rel: str  # REPO/FILE
    change: str  # "+3 -3", "new", "removed", "image changed"...
    diff: str  # the unified diff of a text file ("" for an image)


def _card_files(dist: Path | None) -> dict[str, bytes]:
    """Every card file ``release card`` wrote under ``dist``, by REPO/FILE."""
    repos = sorted(p for p in dist.iterdir() if p.is_dir()) if dist is not None and dist.is_dir() else []
    return {f"{repo.name}/{rel}": (repo / rel).read_bytes() for repo in repos for rel in plain_files(repo)
            if matches(rel, CARD_FILES)}


def card_changes(base: Path | None, dist: Path) -> list[CardChange]:
    """Each card file that differs between the two dists, with its diff (its whole text when it is new)."""
    old, new = _card_files(base), _card_files(dist)
    changes = []
    for rel in sorted(old.keys() | new.keys()):
        before, after = old.get(rel), new.get(rel)
        if before == after:
            continue
        state = "new" if before is None else "removed" if after is None else "changed"
        if rel.endswith(".png"):
            changes.append(CardChange(rel, f"image {state}", ""))
            continue
        a, b = ([] if x is None else x.decode("utf-8", errors="replace").splitlines() for x in (before, after))
        diff = "\n".join(difflib.unified_diff(a, b, f"base/{rel}", f"pull-request/{rel}", lineterm=""))
        changes.append(CardChange(rel, _diff_stat(diff) if state == "changed" else state, diff))
    return changes


def render_card_comment(changes: list[CardChange], request: CardPreviewRequest, compared: int) -> str:
    """The pull-request comment of a card preview: what was rendered, a row per changed card file and each text
    change's diff collapsed, at most COMMENT_BUDGET units (what does not fit is left out with a pointer)."""
    org = request.release.org
    head = [COMMENT_MARKER, f"### Release preview: the cards of release {request.release.version} for {org}", ""]
    head += [request.note, ""] if request.note else []
    head += [f"Cards rendered by `release` {__version__}. No Hub plan: nothing was read from or sent to "
             f"`{hub_endpoint(None)}`, the endpoint a plan would use.", ""]
    if request.base is None:
        head.append(f"No base cards to compare with: {len(changes)} card files rendered.")
    elif not changes:
        head.append(f"This pull request changes none of the {compared} card files.")
    else:
        head.append(f"{len(changes)} of {compared} card files change:")
    rows = ["", "| repo | file | change |", "|---|---|---|"] if changes else []
    rows += [f"| `{org}/{c.rel.partition('/')[0]}` | `{c.rel.partition('/')[2]}` | {c.change} |" for c in changes]
    footer = "\nThe cards rendered in every language, with their plots (`cards/`), and every diff (`cards.diff`) " \
        "are in this run's artifact."
    blocks: list[Block] = [(f"<code>{org}/{c.rel.partition('/')[0]}</code> {c.rel.partition('/')[2]}: {c.change}",
                            [], c.diff) for c in changes if c.diff and request.base is not None]
    return _fitted(head, rows, blocks, footer,
                   ("{n} more card files and every diff are", "The diffs of {n} more card files are"))


def write_card_preview(request: CardPreviewRequest) -> list[CardChange]:
    """``request.out``: ``comment.md``, ``cards.diff`` (every diff whole) and the cards under ``cards/REPO/``;
    written aside and put in place whole. The card files that changed."""
    changes = card_changes(request.base, request.dist)
    rendered = _card_files(request.dist)
    compared = len(rendered.keys() | _card_files(request.base).keys())
    with atomic_dir(request.out) as tmp:
        atomic_write(tmp / "comment.md", render_card_comment(changes, request, compared))
        atomic_write(tmp / "cards.diff", "".join(f"{c.diff}\n" for c in changes if c.diff))
        for rel, data in rendered.items():
            atomic_write(tmp / "cards" / rel, data)
    return changes
