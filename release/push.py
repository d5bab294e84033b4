"""``release push``: what each sibling repo would receive (this version: the dry-run listing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from release import GateError, ReleaseError
from release.config import BuildConfig, ReleaseConfig, available_builds, load_build, load_release
from release.verify import gate

# The Hub stores files of this size or larger, and every safetensors/pth file, through LFS.
LFS_THRESHOLD = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".pth", ".bin", ".png")


@dataclass(frozen=True)
class PushRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    org: str
    dist: Path
    dry_run: bool

    @classmethod
    def create(cls, names: tuple[str, ...], org: str | None, dist: Path, dry_run: bool) -> PushRequest:
        if not dry_run:
            raise ReleaseError("push: only --dry-run is implemented in this version; add --dry-run")
        release = load_release()
        wanted = list(names) or [n for n in available_builds() if (dist / load_build(n).repo).is_dir()]
        if not wanted:
            raise ReleaseError(f"{dist}: no built repos to push; run 'release build NAME' first")
        builds = [load_build(n) for n in wanted]
        for b in builds:
            if not (dist / b.repo).is_dir():
                raise ReleaseError(f"{dist / b.repo}: missing; run 'release build {b.name}' first")
            refusal = gate(dist / b.repo)
            if refusal:
                raise GateError(f"push refused: {refusal}")
        return cls(release, builds, org or release.org, dist, dry_run)


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def plan_release(request: PushRequest) -> str:
    """A Markdown listing of every file each repo would upload (the reviewers' preview)."""
    lines = [f"# Release plan ({'dry run' if request.dry_run else 'push'}) for org `{request.org}`", ""]
    for build in request.builds:
        folder = request.dist / build.repo
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        total = sum(p.stat().st_size for p in files)
        lines += [f"## {request.org}/{build.repo} ({build.name})", "",
                  f"{len(files)} files, {_human(total)}", "", "| file | size | storage |", "|---|---:|---|"]
        for p in files:
            size = p.stat().st_size
            lfs = size >= LFS_THRESHOLD or p.suffix in LFS_SUFFIXES
            lines.append(f"| `{p.relative_to(folder).as_posix()}` | {_human(size)} | {'LFS' if lfs else 'git'} |")
        lines.append("")
    return "\n".join(lines)
