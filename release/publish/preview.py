"""``release push --dry-run --preview DIR``: the pull-request comment (under GitHub's limit), the full plan and the
cards of each repo, for the reviewers of a release."""

from __future__ import annotations

from pathlib import Path

from release import __version__
from release.check.report import CARD_FILES, build_files, matches
from release.core.io import atomic_dir, atomic_write
from release.publish.plan import RepoPlan, human_size, remote_label, render_plan, repo_status
from release.publish.request import PushRequest

COMMENT_LIMIT = 65_536  # GitHub's limit on the body of a comment, in characters
COMMENT_BUDGET = COMMENT_LIMIT - 1_024  # what --preview's comment.md may use: the rest is the posting job's link
COMMENT_MARKER = "<!-- release-push-preview -->"  # the posting job updates the comment that starts with it


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
    return f"README.md +{sum(1 for x in lines if x.startswith('+'))} -{sum(1 for x in lines if x.startswith('-'))}"


def _details(p: RepoPlan) -> str:
    """One repo's changes, collapsed: the commit and the changed files (the README diff is in the full plan)."""
    counts = ", ".join(f"{n} to {a}" for a in ("add", "modify", "delete")
                       if (n := sum(1 for f in p.files if f.action == a)))
    stat = f"; {_diff_stat(p.readme_diff)}" if p.readme_diff else ""
    parent = f" on `{p.head[:12]}`" if p.head else ""
    lines = [f"<details><summary><code>{p.repo_id}</code> ({p.build}): {counts}{stat}</summary>", "",
             f"Commit `{p.commit_message}`{parent}.", "", "| file | action | size | storage |", "|---|---|---:|---|"]
    lines += [f"| `{f.path}` | {f.action} | {human_size(f.size)} | {f.storage} |" for f in p.changes]
    return "\n".join([*lines, "", "</details>", ""])


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
        n = {a: sum(1 for f in p.files if f.action == a) for a in ("add", "modify", "delete", "unchanged")}
        upload = sum(f.size for f in p.files if f.action in ("add", "modify"))
        tag = {"create": "create", "move": "move (--retag)", "unchanged": "unchanged", "none": "-"}[p.tag_action]
        rows.append(f"| `{p.repo_id}` | {p.build} | {repo_status(p, request)} | {n['add']} | {n['modify']} | "
                    f"{n['delete']} | {n['unchanged']} | {human_size(upload)} | {tag} |")
    footer = "\nThe full plan (`plan.md`, `plan.json`: README diffs and the commit description) and the cards " \
        "rendered in every language, with their plots (`cards/`), are in this run's artifact."
    room = COMMENT_BUDGET - _units(footer) - 200  # 200: the note on what was left out
    text, rows_left = _take("\n".join(head), rows, room)
    if rows_left:
        text += f"\n\n{rows_left} more repos and every repo's details are left out here to stay under GitHub's " \
            "comment limit."
    else:
        text, details_left = _take(text + "\n", [_details(p) for p in changing], room)
        if details_left:
            text += f"\nThe details of {details_left} more repos are left out here to stay under GitHub's comment " \
                "limit."
    return text + "\n" + footer + "\n"


def write_preview(out: Path, plans: list[RepoPlan], request: PushRequest, dist: Path) -> None:
    """``out``: ``comment.md`` (``render_comment``), the full plan as ``plan.md`` and ``plan.json``, and the card
    files of each repo under ``cards/REPO/``; written aside and put in place whole."""
    with atomic_dir(out) as tmp:
        atomic_write(tmp / "comment.md", render_comment(plans, request))
        atomic_write(tmp / "plan.md", render_plan(plans, request, "markdown") + "\n")
        atomic_write(tmp / "plan.json", render_plan(plans, request, "json") + "\n")
        for build in request.builds:
            for rel in build_files(dist / build.repo):
                if matches(rel, CARD_FILES):
                    atomic_write(tmp / "cards" / build.repo / rel, (dist / build.repo / rel).read_bytes())
