"""Faults at the publishing trust boundary (issue 11, items 1-6 and a corrupt report): each is a clean refusal.

Every test copies the session's RTN build before changing it: the session fixtures are shared.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from release.core.errors import ReleaseError
from tests.conftest import ROOT, add_card, invoke, write_card
from tests.hub_server import FakeHub
from tests.test_push import RTN

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub
HF_TOKEN_LIKE = "hf_" + "Q" * 34


def _push(dist: Path, target: Path, *args: str) -> Any:
    return invoke("push", "rtn", "--dist", dist, "--target", target, *args)


def _one_line_error(result: Any, code: int, *parts: str) -> None:
    assert result.exit_code == code, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    for part in parts:
        assert part in result.output, result.output


def _leftovers(target: Path) -> list[str]:
    """Hidden staging folders or files in the target (the lock file is the target's own)."""
    return sorted(p.name for p in target.rglob(".*") if p.name != ".release-push.lock") if target.exists() else []


def _shard(folder: Path) -> Path:
    return sorted((folder / "transformer").glob("*.safetensors"))[0]


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- 1. the manifest


def test_report_holds_a_manifest_and_push_refuses_a_flipped_shard(dist: Path, tmp_path: Path) -> None:
    report = json.loads((dist / RTN / "verification" / "report.json").read_text())
    shard = _shard(dist / RTN)
    assert report["manifest"][f"transformer/{shard.name}"]["size"] == shard.stat().st_size
    assert "README.md" in report["after_verification"] and "README.md" not in report["manifest"]
    _flip_last_byte(shard)  # same size: a byte of FP8 weights
    target = tmp_path / "hub"
    for args in (("--dry-run",), (), ("--force", "reviewed")):  # --force does not publish other bytes than verified
        result = _push(dist, target, *args)
        _one_line_error(result, 1, f"{shard}: differs from the bytes 'release verify' hashed",
                        "rerun 'release verify rtn'")
    assert not (target / "np-cr").exists()


def test_a_pickle_that_runs_code_is_refused_before_anything_loads_it(dist: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    import pickle

    (dist / RTN / "modelopt_state.pth").write_bytes(pickle.dumps(Payload()))
    result = _push(dist, tmp_path / "hub")
    _one_line_error(result, 1, f"{dist / RTN / 'modelopt_state.pth'}: differs from the bytes")
    assert not marker.exists() and not (tmp_path / "hub" / "np-cr").exists()


def test_gained_and_lost_files_are_refused_by_name(dist: Path, tmp_path: Path) -> None:
    extra = dist / RTN / "transformer" / "extra.json"
    extra.write_text("{}\n")
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 1,
                    f"{extra}: not in the verification manifest (added after 'release verify')")
    extra.unlink()
    (dist / RTN / "transformer" / "config.json").unlink()
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 1,
                    f"{dist / RTN / 'transformer' / 'config.json'}: verified, but no longer in the build folder")


def test_card_files_may_follow_verification_but_readme_and_license_are_required(dist: Path, tmp_path: Path) -> None:
    (dist / RTN / "README.md").unlink()
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2, f"{dist / RTN / 'README.md'}: missing",
                    "run 'release card rtn'")
    add_card(dist / RTN)
    (dist / RTN / "LICENSE").unlink()
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2, "LICENSE: missing")
    add_card(dist / RTN)
    write_card(dist / RTN, "README.ko.md", "# 카드\n")
    write_card(dist / RTN, "forest.en.png", _png([]))
    result = _push(dist, tmp_path / "hub")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hub" / "np-cr" / RTN / "forest.en.png").read_bytes() == _png([])


@pytest.mark.parametrize("rel, make, message", [
    ("README.evil.md", lambda f, t: (f / "README.evil.md").write_text("# not the tool's\n"),
     "no file this release writes (its languages: en, ko"),
    ("README.ko.md", lambda f, t: (f / "README.ko.md").write_text("# not the tool's\n"), "not written by this tool"),
    ("results/hl.npz", lambda f, t: (f / "results").mkdir(exist_ok=True) or os.link(t, f / "results" / "hl.npz"),
     "not written by this tool"),
    ("README.md", lambda f, t: (f / "README.md").write_text("# edited by hand\n"), "changed since 'release card'"),
    ("results/fake.npz", lambda f, t: write_card(f, "results/fake.npz", b"twelve bytes"), "not an npz archive"),
    ("forest.en.png", lambda f, t: write_card(f, "forest.en.png", b"GIF89a"), "not a PNG image"),
])
def test_files_after_verification_are_published_only_as_the_tool_wrote_them(
        rel: str, make: Any, message: str, dist: Path, tmp_path: Path) -> None:
    """Issue 34: a file matching a card or result pattern is published only while verification/written.json
    records it with these bytes (``release card`` and ``release eval`` record what they write) and it has the content
    its name promises; the record itself is not published."""
    outside = tmp_path / "outside.txt"
    outside.write_text("12 bytes....")
    path = dist / RTN / rel
    before = path.read_bytes() if path.is_file() else None
    make(dist / RTN, outside)
    result = _push(dist, tmp_path / "hub", "--dry-run")
    _one_line_error(result, 1, f"{path}: {message}")
    if before is None:
        path.unlink()
    else:
        write_card(dist / RTN, rel, before)  # as 'release card' rewrites it
    plan = _push(dist, tmp_path / "hub", "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert "written.json" not in plan.output


def test_bytes_flipped_with_the_mtime_restored_are_hashed_again(dist: Path, tmp_path: Path) -> None:
    assert _push(dist, tmp_path / "hub", "--dry-run").exit_code == 0  # fills the hash cache
    shard = _shard(dist / RTN)
    st = shard.stat()
    _flip_last_byte(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_size == st.st_size and shard.stat().st_mtime_ns == st.st_mtime_ns
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 1, f"{shard}: differs from the bytes")


def test_a_file_changed_after_the_plan_is_not_published(dist: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Time of check to time of use: the bytes copied are hashed again and must be those the plan hashed."""
    import release.publish.push as push

    plan_repo = push.plan_repo
    shard = _shard(dist / RTN)

    def plan_then_tamper(*args: Any, **kwargs: Any) -> Any:
        plan = plan_repo(*args, **kwargs)
        _flip_last_byte(shard)
        return plan

    monkeypatch.setattr(push, "plan_repo", plan_then_tamper)
    target = tmp_path / "hub"
    _one_line_error(_push(dist, target, "-q"), 1, f"{shard}: changed after this push hashed it")  # -q: no progress
    assert not (target / "np-cr" / RTN).exists() and _leftovers(target) == []


def test_a_file_changed_after_the_plan_is_not_committed_to_the_hub(hub: FakeHub, dist: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import release.publish.push as push

    plan_repo = push.plan_repo
    config = dist / RTN / "transformer" / "config.json"

    def plan_then_tamper(*args: Any, **kwargs: Any) -> Any:
        plan = plan_repo(*args, **kwargs)
        config.write_text(config.read_text() + " ")
        return plan

    monkeypatch.setattr(push, "plan_repo", plan_then_tamper)
    result = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", hub.url)  # -q: no progress before the error
    _one_line_error(result, 1, f"{config}: changed after this push hashed it")
    assert not hub.repos  # nothing was created or committed


def test_a_file_changed_during_its_lfs_upload_is_one_line_naming_it(hub: FakeHub, dist: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard changes after the push hashed it and huggingface_hub took its object id, before its bytes are sent:
    the Hub refuses the upload, and the error says which file changed, not the raw upload error."""
    import huggingface_hub._commit_api as commit_api

    import release.publish.push as push

    monkeypatch.setattr(push, "LFS_THRESHOLD", 1)  # uploaded from its path, as a Nano shard is (the tiny one is small)
    shard = _shard(dist / RTN)
    upload = commit_api._upload_lfs_files

    def tamper_then_upload(*args: Any, **kwargs: Any) -> Any:
        _flip_last_byte(shard)
        return upload(*args, **kwargs)

    monkeypatch.setattr(commit_api, "_upload_lfs_files", tamper_then_upload)
    result = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", hub.url)
    _one_line_error(result, 1, f"{shard}: changed after this push hashed it")
    assert len(hub.commits(f"np-cr/{RTN}")) == 1  # the repo's initial commit: nothing of the build


def test_a_hub_that_stores_other_bytes_under_the_approved_id_is_caught_and_not_tagged(hub: FakeHub,
                                                                                     dist: Path) -> None:
    """The listing after the commit shows the object ids the client declared; the bytes the Hub keeps are checked
    by downloading each uploaded LFS file back at the commit."""
    hub.store_lfs = lambda data: data[:-1] + bytes([data[-1] ^ 1])
    result = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", hub.url)
    _one_line_error(result, 2, "downloaded back, are not the hashed local file", f"np-cr/{RTN}: committed ")
    assert result.output.rstrip().endswith("not tagged")
    assert hub.tags(f"np-cr/{RTN}") == {}
    # the rerun has nothing to commit (the listing shows the approved ids), but it would tag a commit it did not
    # make: that commit's LFS files are read back first
    again = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", hub.url)
    _one_line_error(again, 2, "no changes to commit, but on ", "downloaded back, are not the hashed local file")
    assert hub.tags(f"np-cr/{RTN}") == {}
    for f in (dist / RTN).rglob("*"):  # the Hub's stored bytes mended: the rerun reads them back and tags
        data = f.read_bytes() if f.is_file() else b""
        if hashlib.sha256(data).hexdigest() in hub.lfs_objects:
            hub.lfs_objects[hashlib.sha256(data).hexdigest()] = data
    assert invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", hub.url).exit_code == 0
    assert list(hub.tags(f"np-cr/{RTN}")) == ["v1.0.0"]


def test_a_read_only_target_is_one_line_and_changes_nothing(dist: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """`push --target` into a folder on a read-only file system (a copy published earlier): one line naming it,
    exit 2, the published copy unchanged."""
    from tests.test_faults_inputs import _read_only, _snapshot

    target = tmp_path / "hub"
    assert _push(dist, target, "-q").exit_code == 0
    before = _snapshot(target)
    _read_only(target, monkeypatch)
    _one_line_error(_push(dist, target, "-q", "--retag"), 2, str(target), "Read-only file system")
    monkeypatch.undo()
    assert _snapshot(target) == before


# ---------------------------------------------------------------- 2. names that become paths or repo ids


def test_an_org_that_leaves_the_target_is_refused_and_nothing_is_touched(dist: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim" / RTN
    victim.mkdir(parents=True)
    (victim / "precious.txt").write_text("keep me\n")
    target = tmp_path / "hub"
    for org in ("../victim", "..", "a/b", ".hidden", ""):
        result = invoke("push", "rtn", "--dist", dist, "--target", target, "--org", org)
        _one_line_error(result, 2, f"--org: {org!r} is not a valid Hub org name")
    assert (victim / "precious.txt").read_text() == "keep me\n" and not target.exists()


@pytest.mark.parametrize("file, old, new, field", [
    ("rtn.yaml", "repo: Cosmos3-Nano-Policy-DROID-FP8", "repo: ../../x", "repo"),
    ("release.yaml", "  rtn: Cosmos3-Nano-Policy-DROID-FP8", "  rtn: ../x", "repos"),
    ("release.yaml", "org: np-cr", "org: ../victim", "org"),
])
def test_build_files_cannot_name_a_path(file: str, old: str, new: str, field: str, dist: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    builds = tmp_path / "builds"
    shutil.copytree(ROOT / "builds", builds)
    text = (builds / file).read_text()
    assert old in text
    (builds / file).write_text(text.replace(old, new))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    result = _push(dist, tmp_path / "hub")
    _one_line_error(result, 2, f"{builds / file}:", f"field '{field}'", "is not a valid Hub")
    assert not (tmp_path / "hub").exists() and not (tmp_path / "x").exists()


def test_a_target_org_folder_linked_outside_is_refused(dist: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "hub"
    target.mkdir()
    (target / "np-cr").symlink_to(outside)
    _one_line_error(_push(dist, target), 2, "outside the target")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("make, message", [
    (lambda f: (f / "loop").symlink_to("loop"), "that loops or points nowhere"),
    (lambda f: (f / "transformer" / "up").symlink_to(".."), "a link to .."),
    (lambda f: (f / "link.json").symlink_to(f / "provenance.json"), "the Hub stores files, not links"),
    (lambda f: os.mkfifo(f / "pipe"), "a pipe, not a regular file"),
    (lambda f: (f / "results").mkdir(exist_ok=True) or (f / "results" / "a\nb.npz").write_bytes(b"x"),
     "its name holds a control character"),
    (lambda f: os.close(os.open(os.fsencode(f) + b"/results-\xff.npz", os.O_CREAT | os.O_WRONLY)),
     "its name is not valid UTF-8"),
])
def test_links_loops_and_pipes_are_refused_cleanly(make: Any, message: str, dist: Path, tmp_path: Path) -> None:
    make(dist / RTN)
    target = tmp_path / "hub"
    for args in (("--dry-run",), ()):
        _one_line_error(_push(dist, target, *args), 2, message)
    assert not (target / "np-cr").exists() and _leftovers(target) == []


def test_a_push_with_nothing_to_change_still_clears_what_a_killed_push_left(dist: Path, tmp_path: Path) -> None:
    """A push killed just after the exchange leaves the repo's old copy as ``.REPO.tmp-PID-...`` beside it: the next
    push to that repo removes it (its process is gone), also when the repo itself has nothing to change."""
    target = tmp_path / "hub"
    assert _push(dist, target).exit_code == 0
    dead = subprocess.Popen(["true"])  # a process that has ended
    dead.wait()
    stale = target / "np-cr" / f".{RTN}.tmp-{dead.pid}-0a1b2c3d"
    shutil.copytree(target / "np-cr" / RTN, stale)
    running = target / "np-cr" / f".{RTN}.tmp-{os.getpid()}-0a1b2c3d"  # a live push's: kept
    running.mkdir()
    result = _push(dist, target)
    assert result.exit_code == 0 and "no changes" in result.output, result.output
    assert not stale.exists() and running.is_dir()


def test_the_jobs_folder_of_a_dist_is_not_published(dist: Path, tmp_path: Path) -> None:
    """``--executor processes|slurm`` leaves submitit's folder in DIST/.jobs/ (the jobs' pickled calls and logs, which
    may quote the environment): no build's file, so neither the plan nor the push takes anything from it."""
    jobs = dist / ".jobs"
    jobs.mkdir()
    (jobs / "4242_0_log.err").write_text(f"HF_TOKEN={HF_TOKEN_LIKE}\n")
    (jobs / "4242_submitted.pkl").write_bytes(b"\x80\x04N.")
    target = tmp_path / "hub"
    plan = _push(dist, target, "--dry-run")
    assert plan.exit_code == 0 and ".jobs" not in plan.output and HF_TOKEN_LIKE not in plan.output, plan.output
    result = _push(dist, target)
    assert result.exit_code == 0 and HF_TOKEN_LIKE not in result.output, result.output
    pushed = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert pushed and not [p for p in pushed if ".jobs" in p or p.endswith((".pkl", "_log.err"))], pushed


# ---------------------------------------------------------------- 3. skipped is not passed


def _verify_without_reference(dist: Path, tiny: Path) -> dict[str, Any]:
    from release.check.verify import VerifyRequest, verify
    from release.core.builds import load_build, load_release

    request = VerifyRequest(load_release(), load_build("rtn"), dist / RTN, None, tiny / "source",
                            tiny / "observations")
    verify(request)
    report: dict[str, Any] = json.loads((dist / RTN / "verification" / "report.json").read_text())
    return report


def test_skipped_checks_refuse_the_push_unless_forced(dist: Path, tiny: Path, tmp_path: Path) -> None:
    report = _verify_without_reference(dist, tiny)
    assert report["status"] == "incomplete"
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "layout": "skipped", "quantization_config": "skipped", "modelopt_state": "skipped", "values": "passed",
        "consistency": "passed", "loadable": "passed"}
    target = tmp_path / "hub"
    _one_line_error(_push(dist, target), 1, "push refused: Cosmos3-Nano-Policy-DROID-FP8 was not fully verified "
                    "(layout, quantization_config, modelopt_state skipped: no reference", "--force REASON")
    planned = _push(dist, target, "--force", "no reference on this machine", "--dry-run")
    assert "[forced past verification: no reference on this machine]" in planned.stdout  # in the commit message
    forced = _push(dist, target, "--force", "no reference on this machine")
    assert forced.exit_code == 0 and "changes published, checksums verified" in forced.stdout, forced.output
    assert ("warning: Cosmos3-Nano-Policy-DROID-FP8 was not fully verified (layout, quantization_config, "
            "modelopt_state skipped: no reference") in forced.stderr  # a real push no longer prints the plan
    assert "push goes on under --force (no reference on this machine)" in forced.stderr


def test_the_card_says_which_checks_ran(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    shutil.copytree(ROOT / "tests" / "data" / "cards", dist)
    path = dist / RTN / "verification" / "report.json"
    report = json.loads(path.read_text())
    for check in report["checks"][:3]:
        check.update(status="skipped", summary="skipped: no reference")
    report.update(status="incomplete", reference=None)
    path.write_text(json.dumps(report))
    result = invoke("card", "rtn", "--dist", dist, "--lang", "en,ko")
    assert result.exit_code == 0, result.output
    en = (dist / RTN / "README.md").read_text(encoding="utf-8")
    assert "without a reference checkpoint" in en
    assert "Not every check ran, so this build is not fully verified. Skipped: Files, tensor names, dtypes and " \
           "shapes, `quantization_config`" in en
    assert "| Files, tensor names, dtypes and shapes | skipped | not run: no reference checkpoint |" in en
    ko = (dist / RTN / "README.ko.md").read_text(encoding="utf-8")
    assert "완전히 검증되지 않았습니다" in ko and "| 건너뜀 |" in ko
    other = (dist / "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant")
    assert invoke("card", "sq_auto", "--dist", dist, "--lang", "en").exit_code == 0
    assert "All 6 checks ran." in (other / "README.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------- 4. secrets, by content


def _png(chunks: list[tuple[bytes, bytes]]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + b"".join(chunk(k, d) for k, d in chunks) + \
        chunk(b"IDAT", zlib.compress(b"\0\0")) + chunk(b"IEND", b"")


@pytest.mark.parametrize("kind, data, where", [
    (b"tEXt", b"Comment\0token " + HF_TOKEN_LIKE.encode(), "PNG chunk tEXt 'Comment'"),
    (b"zTXt", b"Comment\0\0" + zlib.compress(HF_TOKEN_LIKE.encode()), "PNG chunk zTXt 'Comment'"),
    (b"iTXt", b"Author\0\1\0en\0\0" + zlib.compress(HF_TOKEN_LIKE.encode()), "PNG chunk iTXt 'Author'"),
])
def test_a_token_in_a_png_text_chunk_is_refused(kind: bytes, data: bytes, where: str, dist: Path,
                                                tmp_path: Path) -> None:
    write_card(dist / RTN, "forest.en.png", _png([(kind, data)]))  # a card file: allowed after verification
    result = _push(dist, tmp_path / "hub")
    _one_line_error(result, 2, f"{dist / RTN / 'forest.en.png'}: contains what looks like a Hugging Face token "
                    f"(hf_…, in {where})")
    assert "QQQQ" not in result.output and not (tmp_path / "hub" / "np-cr").exists()


def test_a_zlib_bomb_in_a_png_is_refused(dist: Path, tmp_path: Path) -> None:
    bomb = zlib.compress(b"\0" * (65 << 20), 9)
    write_card(dist / RTN, "forest.en.png", _png([(b"zTXt", b"Comment\0\0" + bomb)]))
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2, "PNG chunk zTXt 'Comment' inflates to more "
                    "than 64 MiB")


def test_secrets_in_safetensors_metadata_and_json_strings(dist: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    extra = dist / RTN / "extra.safetensors"
    save_file({"w": torch.zeros(2)}, str(extra), metadata={"format": "pt", "note": "ghp_" + "x" * 36})
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2,
                    f"{extra}: contains what looks like a GitHub token (ghp_…, in the safetensors header at "
                    "$.__metadata__.note)")
    extra.unlink()
    notes = dist / RTN / "notes.json"  # a JSON escape hides the key from a byte scan: \u0041 is "A"
    notes.write_text('{"aws": {"key": "\\u0041SIA' + "Z" * 16 + '"}}')
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2,
                    f"{notes}: contains what looks like a AWS access key id (ASIA…, in JSON at $.aws.key)")


@pytest.mark.parametrize("token, kind, shown", [
    ("github_pat_" + "A1_" * 10, "GitHub token", "github_pat_…"),
    ("gho_" + "b" * 36, "GitHub token", "gho_…"),
    ("ASIA" + "Q" * 16, "AWS access key id", "ASIA…"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key", "-----BEGIN OPENSSH PRIVATE KEY-----"),
])
def test_each_kind_of_secret_is_found_and_never_printed(token: str, kind: str, shown: str, dist: Path,
                                                        tmp_path: Path) -> None:
    write_card(dist / RTN, "README.md", f"# card\n\nexample: {token}\n")
    result = _push(dist, tmp_path / "hub", "--dry-run")
    _one_line_error(result, 2, f"contains what looks like a {kind} ({shown}, at byte 17)")
    if kind != "private key":
        assert token not in result.output


def _npz(compressed: bool) -> bytes:
    import io

    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, note=np.array([HF_TOKEN_LIKE]))  # numpy's UTF-32
    return buffer.getvalue()


def _zip(name: str, data: bytes) -> bytes:
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(name, data)
    return buffer.getvalue()


ENCODED = HF_TOKEN_LIKE[3:]  # what follows hf_
ENCODED_SECRETS: dict[str, tuple[str, Callable[[], bytes], str]] = {
    "base64": ("notes.txt", lambda: b"data: " + base64.b64encode(b"token=" + HF_TOKEN_LIKE.encode()), "in base64"),
    "UTF-16LE appended to LICENSE": ("LICENSE", lambda: b"OpenMDW License 1.1\n" + HF_TOKEN_LIKE.encode("utf-16-le"),
                                     "in UTF-16"),
    "a UTF-32 numpy string in an npz": ("results/a.npz", lambda: _npz(False), "in UTF-32"),
    "savez_compressed": ("results/b.npz", lambda: _npz(True), "in zip member 'note.npy'"),
    "a gzip file named .npz": ("results/c.npz", lambda: gzip.compress(HF_TOKEN_LIKE.encode()), "in the gzip data"),
    "a zip-deflated member": ("extras.zip", lambda: _zip("notes.txt", HF_TOKEN_LIKE.encode()),
                              "in zip member 'notes.txt'"),
    "PNG iCCP": ("forest.en.png", lambda: _png([(b"iCCP", b"icc\0\0" + zlib.compress(HF_TOKEN_LIKE.encode()))]),
                 "in PNG chunk iCCP 'icc'"),
    "a private compressed PNG chunk": ("forest.en.png",
                                       lambda: _png([(b"prVt", zlib.compress(HF_TOKEN_LIKE.encode()))]),
                                       "in PNG chunk prVt"),
    "PNG eXIf in UTF-16": ("forest.en.png", lambda: _png([(b"eXIf", b"MM\0*" + HF_TOKEN_LIKE.encode("utf-16-be"))]),
                           "in UTF-16"),
    "percent-encoding": ("README.md", lambda: f"# card\n\nhf%5F{ENCODED}\n".encode(),
                         "in the text with percent-escapes decoded"),
    "a YAML \\x68f_ escape": ("builds/notes.yaml", lambda: f'note: "\\x68f_{ENCODED}"\n'.encode(), "in YAML at $.note"),
    "an HTML entity in the Korean card": ("README.ko.md", lambda: f"# 카드\n\n&#104;f_{ENCODED}\n".encode(),
                                          "in the text with HTML entities decoded"),
}


@pytest.mark.parametrize("case", ENCODED_SECRETS)
def test_an_encoded_secret_is_found_where_a_reader_would_decode_it(case: str, dist: Path, tmp_path: Path) -> None:
    """Issue 34: the scan decodes what the tool can parse (zip members, gzip, PNG chunks, YAML, HTML entities,
    percent-escapes) and searches UTF-16/32 views and base64 runs: each hidden token is named, never shown."""
    rel, make, where = ENCODED_SECRETS[case]
    path = dist / RTN / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(make())
    result = _push(dist, tmp_path / "hub", "--dry-run")
    _one_line_error(result, 2, f"{path}: contains what looks like a Hugging Face token (hf_…, ", where)
    assert ENCODED not in result.output


def test_a_pgp_private_key_block_is_found(dist: Path, tmp_path: Path) -> None:
    write_card(dist / RTN, "README.md", "# card\n\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n")
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2,
                    "contains what looks like a private key (-----BEGIN PGP PRIVATE KEY BLOCK-----, at byte 8)")


def test_a_token_across_a_chunk_boundary_of_a_large_file_is_found(dist: Path, tmp_path: Path) -> None:
    from release.publish.scan import CHUNK

    big = dist / RTN / "README.md"  # 17 MB: above the LFS threshold, streamed in chunks
    start = CHUNK - 10
    big.write_bytes(b"#" * start + HF_TOKEN_LIKE.encode() + b"\n" + b"#" * (1 << 20))
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2, f"(hf_…, at byte {start})")


# ---------------------------------------------------------------- 5. tags


def test_a_release_tag_is_never_claimed_and_moves_only_with_retag(hub: FakeHub, dist: Path) -> None:
    repo = f"np-cr/{RTN}"
    plan = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--dry-run")
    assert "Tag `v1.0.0`: create on the new commit." in plan.output
    first = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url)
    assert first.exit_code == 0 and "tagged v1.0.0" in first.output
    head = hub.head(repo)
    assert hub.tags(repo) == {"v1.0.0": head}
    again = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url)
    assert again.exit_code == 0 and f"no changes, nothing uploaded; tag v1.0.0 already on {head[:12]}" in again.output
    add_card(dist / RTN, "---\nlicense: other\n---\n# second card\n")
    for args in (("--dry-run",), ()):
        refused = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, *args)
        _one_line_error(refused, 2, f"{repo}: tag v1.0.0 already points at {head[:12]}, not at the new commit",
                        "pass --retag")
    assert hub.head(repo) == head and len(hub.commits(repo)) == 2  # refused before committing
    plan = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--dry-run", "--retag")
    assert f"Tag `v1.0.0`: move from `{head[:12]}` to the new commit (--retag)." in plan.output
    moved = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--retag")
    assert moved.exit_code == 0, moved.output
    new = hub.head(repo)
    assert new != head and hub.tags(repo) == {"v1.0.0": new}
    assert f"moved tag v1.0.0 from {head[:12]} to {new[:12]}" in moved.output and "tagged" not in moved.output


# ---------------------------------------------------------------- 6. one push at a time per target


def test_a_second_push_to_a_target_fails_while_another_process_holds_it(dist: Path, tmp_path: Path) -> None:
    target = tmp_path / "hub"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from release.core.io import exclusive_lock\n"
         f"with exclusive_lock(Path({str(target / '.release-push.lock')!r}), 'x'):\n"
         "    print('held', flush=True); sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result = _push(dist, target)
        _one_line_error(result, 2, f"another push to {target} is running (pid {holder.pid})")
        assert not (target / "np-cr").exists()
    finally:
        holder.communicate("")
    assert _push(dist, target).exit_code == 0  # the lock went with the process


def test_two_pushes_in_one_process_do_not_interleave(dist: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import release.publish.push as push

    target = tmp_path / "hub"
    copying, release_copy = threading.Event(), threading.Event()
    copy = push._copy_hashed

    def slow_copy(*args: Any) -> None:
        copying.set()
        release_copy.wait(30)
        copy(*args)

    monkeypatch.setattr(push, "_copy_hashed", slow_copy)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            push.run_push(push.PushRequest.create(("rtn",), None, dist, False, target=target))
        except BaseException as exc:  # reported below, in the main thread
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    assert copying.wait(30)
    with pytest.raises(ReleaseError, match=rf"another push to {target} is running \(pid {os.getpid()}\)"):
        push.run_push(push.PushRequest.create(("rtn",), None, dist, False, target=target))
    release_copy.set()
    thread.join(60)
    assert not errors and (target / "np-cr" / RTN / "README.md").is_file() and _leftovers(target) == []


# ---------------------------------------------------------------- 10. a corrupt report


@pytest.mark.parametrize("content, message", [
    (b'{"checks": [', "not valid JSON (Expecting value at line 1 column 13)"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply to read"),
    (b"[]", "field '(top level)'"),
    (b'{"checks": [], "passed": true}', "written by an older 'release verify' (no file manifest)"),
])
def test_a_corrupt_report_is_a_one_line_error(content: bytes, message: str, dist: Path, tmp_path: Path) -> None:
    path = dist / RTN / "verification" / "report.json"
    path.write_bytes(content)
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2, f"{path}: {message}",
                    "rerun 'release verify rtn'")


def test_json_nested_too_deeply_is_refused_where_the_tool_reads_it(dist: Path, tmp_path: Path) -> None:
    """Issue 34: a JSON file of a build folder nested 100,000 deep cannot be scanned for secrets: refused in one
    line; a hash cache nested so is a damaged cache, started afresh."""
    from release.publish.hashing import HashCache

    deep = b"[" * 100_000 + b"]" * 100_000
    (dist / RTN / "notes.json").write_bytes(deep)
    _one_line_error(_push(dist, tmp_path / "hub", "--dry-run"), 2,
                    f"{dist / RTN / 'notes.json'}: JSON nested too deeply to scan for secrets")
    cache = tmp_path / "hashes.json"
    cache.write_bytes(deep)
    assert HashCache(cache).entries == {}


# ---------------------------------------------------------------- 11. the release manifest (issue 15)


def _resign(sidecar: dict[str, Any]) -> None:
    sidecar["sha256"] = hashlib.sha256("\n".join(sidecar["lines"]).encode()).hexdigest()


def _shard_entry(lock: dict[str, Any]) -> dict[str, Any]:
    files = lock["siblings"][0]["files"]
    entry: dict[str, Any] = files[next(rel for rel in sorted(files) if rel.endswith(".safetensors"))]
    return entry


def _rename_file(lock: dict[str, Any], new: str) -> None:
    files = lock["siblings"][0]["files"]
    files[new] = files.pop("model_index.json")


def _secret_in_tables(lock: dict[str, Any]) -> None:
    sidecar = lock["sidecars"]["tables/tables.json"]
    sidecar["lines"].insert(1, f'  "note": "{HF_TOKEN_LIKE}",')
    _resign(sidecar)


def _edit_provenance(lock: dict[str, Any]) -> None:
    sidecar = lock["sidecars"][f"{RTN}/provenance.json"]
    sidecar["lines"].insert(1, '  "edited": true,')
    _resign(sidecar)


def _edit_report_sidecar(lock: dict[str, Any]) -> None:
    sidecar = lock["sidecars"][f"{RTN}/verification/report.json"]
    sidecar["lines"] = ["[]"]
    _resign(sidecar)


def _retype_other_provenance(lock: dict[str, Any]) -> None:
    """Issue 34: a provenance of the sweep (not a sibling's, so not hash-bound to a verified file) whose 'fp8' is a
    string, re-signed."""
    other = json.loads("\n".join(lock["sidecars"][f"{RTN}/provenance.json"]["lines"]))
    other.update(build="rtn_mavg", repo=f"{RTN}-RTN-MovingAvgObserver", fp8="x")
    sidecar = {"lines": json.dumps(other, indent=2).split("\n")}
    _resign(sidecar)
    lock["sidecars"][f"{RTN}-RTN-MovingAvgObserver/provenance.json"] = sidecar


def _edit_config_sidecar(lock: dict[str, Any]) -> None:
    """The transformer config the card's vLLM-Omni paragraph reads, edited in the manifest."""
    sidecar = lock["sidecars"][f"{RTN}/transformer/config.json"]
    sidecar["lines"].insert(1, '  "edited": true,')
    _resign(sidecar)


def _rename_sidecar(lock: dict[str, Any], new: str) -> None:
    lock["sidecars"][new] = lock["sidecars"].pop(f"{RTN}/provenance.json")


@pytest.mark.parametrize("edit, code, parts", [
    (lambda lock: lock.update(format="release-manifest/0"), 2, ["field 'format'"]),
    (lambda lock: _shard_entry(lock).update(sha256="0" * 64), 1,
     [f"release.lock.json: siblings[0] ({RTN}) file 'transformer/", "differs from the bytes 'release verify' hashed",
      "run 'release verify rtn' and 'release manifest' again"]),
    (lambda lock: lock["siblings"][0]["files"].pop("model_index.json"), 1,
     ["file 'model_index.json': verified, but no longer in the build folder"]),
    (lambda lock: lock["siblings"][0]["files"].pop("transformer/config.json"), 2,
     [f"siblings[0] ({RTN}) needs the sidecar and the file transformer/config.json"]),
    (lambda lock: lock["sidecars"]["tables/tables.json"]["lines"].append("x"), 2,
     ["field 'sidecars['tables/tables.json']': its lines do not hash to its sha256 (edited by hand?)"]),
    (_edit_provenance, 2, [f"the sidecar {RTN}/provenance.json is not the file of siblings[0]"]),
    (_edit_report_sidecar, 2, [f"sidecar {RTN}/verification/report.json is not the file of siblings[0]"]),
    (_retype_other_provenance, 2, ["provenance.json: field 'fp8': Input should be a valid dictionary",
                                   "run 'release build"]),
    (lambda lock: _rename_file(lock, "../../etc/passwd"), 2,
     ["field 'siblings[0].files': '../../etc/passwd' is not a path inside a repo"]),
    (lambda lock: _rename_file(lock, "/etc/passwd"), 2, ["'/etc/passwd' is not a path inside a repo"]),
    (lambda lock: _rename_file(lock, "transformer/./x.json"), 2, ["is not a path inside a repo"]),
    (lambda lock: _rename_file(lock, ".env"), 2, ["'.env' looks like a secret (by its name)"]),
    (lambda lock: _rename_sidecar(lock, "../victim/provenance.json"), 2,
     ["field 'sidecars': '../victim/provenance.json' is not a sidecar"]),
    (lambda lock: _rename_sidecar(lock, f"{RTN}/transformer/modelopt_state.pth"), 2, ["is not a sidecar"]),
    (_edit_config_sidecar, 2, [f"the sidecar {RTN}/transformer/config.json is not the file of siblings[0]"]),
    (lambda lock: lock["siblings"][0].update(repo="../victim"), 2,
     ["field 'siblings[0].repo': '../victim' is not a valid Hub repo name"]),
    (lambda lock: lock["siblings"][0].update(build="../rtn"), 2,
     ["field 'siblings[0].build': '../rtn' is not a build name"]),
    (lambda lock: lock["siblings"][0].update(build="sq_auto"), 2,
     ["field 'siblings[0].build' is 'sq_auto', but Cosmos3-Nano-Policy-DROID-FP8 is the repo of build 'rtn'"]),
    (_secret_in_tables, 2, ["field 'sidecars['tables/tables.json']': contains what looks like a Hugging Face token "
                            "(hf_…, in JSON at $.note)"]),
])
def test_a_bad_manifest_is_refused_by_its_field(edit: Any, code: int, parts: list[str], release_lock: Path,
                                                tmp_path: Path) -> None:
    lock = json.loads(release_lock.read_text())
    edit(lock)
    path = tmp_path / "release.lock.json"
    path.write_text(json.dumps(lock, indent=2))
    target = tmp_path / "hub"
    result = invoke("push", "--dry-run", "--from-manifest", path, "--target", target)
    _one_line_error(result, code, *parts)
    assert HF_TOKEN_LIKE not in result.output and not target.exists()
    assert not (tmp_path / "victim").exists() and not (ROOT / "victim").exists()


@pytest.mark.parametrize("content, message", [
    (None, "missing (the release manifest); run 'release manifest' after a real build and commit it"),
    (b'{"format": ', "not valid JSON (Expecting value at line 1 column 12); run 'release manifest'"),
    (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply to read; run 'release manifest'"),
    (b"\x80\x81", "not valid JSON (not UTF-8 text)"),
    (b"[]", "field '(top level)'"),
])
def test_a_missing_or_corrupt_manifest_is_one_line(content: bytes | None, message: str, tmp_path: Path) -> None:
    path = tmp_path / "release.lock.json"
    if content is not None:
        path.write_bytes(content)
    _one_line_error(invoke("push", "--dry-run", "--from-manifest", path), 2, f"{path}: {message}")


def test_the_manifest_is_written_from_verified_secret_free_builds_only(carded: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    shutil.copytree(carded, dist)
    tables = dist / "tables" / "tables.json"
    tables.write_text(tables.read_text().replace('{\n', '{\n  "note": "' + HF_TOKEN_LIKE + '",\n', 1))
    (dist / "selection.json").unlink()  # made from the tables before the edit; without it RTN ('always') is delivered
    out = tmp_path / "release.lock.json"
    result = invoke("manifest", "--dist", dist, "--out", out)
    _one_line_error(result, 2, f"{tables}: contains what looks like a Hugging Face token (hf_…, in JSON at $.note)")
    assert HF_TOKEN_LIKE not in result.output and not out.exists()
    shutil.copy(carded / "tables" / "tables.json", tables)
    _flip_last_byte(_shard(dist / RTN))
    _one_line_error(invoke("manifest", "--dist", dist, "--out", out), 1, "differs from the bytes 'release verify'")
    shutil.rmtree(dist / RTN / "verification")
    _one_line_error(invoke("manifest", "--dist", dist, "--out", out), 1,
                    "manifest refused: Cosmos3-Nano-Policy-DROID-FP8 has no verification report")
    assert not out.exists()


# `release manifest ...` that SIGKILLs itself in the middle of writing OUT (its first argument): "write" after half
# of the temporary file's bytes, "replace" just before the temporary is renamed onto OUT.
MANIFEST_KILLED = r"""
import os, signal, sys
from pathlib import Path

out, at = Path(sys.argv.pop(1)), sys.argv.pop(1)
open_, fdopen, replace = os.open, os.fdopen, os.replace
temporaries = set()

def tracked(path, flags, *args, **kwargs):
    fd = open_(path, flags, *args, **kwargs)
    if Path(path).name.startswith(f".{out.name}"):
        temporaries.add(fd)
    return fd

class Half:
    def __init__(self, file):
        self.file = file
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.file.close()
    def write(self, data):
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        os.kill(os.getpid(), signal.SIGKILL)

def half(fd, *args, **kwargs):
    file = fdopen(fd, *args, **kwargs)
    return Half(file) if fd in temporaries else file

def last(src, dst):
    if Path(dst) == out:
        os.kill(os.getpid(), signal.SIGKILL)
    return replace(src, dst)

if at == "write":
    os.open, os.fdopen = tracked, half
else:
    os.replace = last
from release.cli import main
main()
"""


@pytest.mark.parametrize("at", ["write", "replace"])
def test_a_kill_while_the_manifest_is_written_leaves_the_old_one_whole(at: str, carded: Path, builds: Path,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "release.lock.json"
    assert invoke("manifest", "--dist", carded, "--out", out).exit_code == 0
    new = out.read_bytes()
    out.write_bytes(b'{"the": "old manifest"}\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RELEASE_BUILDS": str(builds)}
    argv = [sys.executable, "-c", MANIFEST_KILLED, str(out), at, "manifest", "--dist", str(carded), "--out", str(out)]
    killed = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert out.read_bytes() == b'{"the": "old manifest"}\n'
    again = invoke("manifest", "--dist", carded, "--out", out)
    assert again.exit_code == 0, again.output
    assert out.read_bytes() == new and sorted(os.listdir(tmp_path)) == ["builds", "release.lock.json"]  # no temporary


def test_on_the_xet_path_other_stored_bytes_under_the_declared_sha256_are_caught(xet_hub: FakeHub,
                                                                                 dist: Path) -> None:
    """Through hf_xet the sha256 the Hub records is the one the client sends; the Xet store keeping other bytes
    under it shows in the Xet hash the Hub lists, and the release is not tagged."""
    xet_hub.store_lfs = lambda data: data[:-1] + bytes([data[-1] ^ 1])
    result = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", xet_hub.url)
    _one_line_error(result, 2, "are not the hashed local file (Xet hash ", f"np-cr/{RTN}: committed ")
    assert xet_hub.lfs_uploads == [] and xet_hub.xet_hashes  # it went through Xet
    assert xet_hub.tags(f"np-cr/{RTN}") == {}
    # the listing's sha256 are the approved ones; its Xet hashes are not the local files': the plan uploads them again
    plan = invoke("push", "rtn", "--dist", dist, "--endpoint", xet_hub.url, "--dry-run")
    assert plan.exit_code == 0, plan.output
    lfs = xet_hub.commits(f"np-cr/{RTN}")[-1]["lfs_files"]
    assert all(f"| `{path}` | modify |" in plan.output for path in lfs)


def test_a_collection_the_hub_refuses_is_one_line_after_the_repos_are_pushed(hub: FakeHub, dist: Path) -> None:
    """A token that may push the repos but not edit the org's collections: the repos are pushed and tagged, the
    collection step is a one-line error that says so (exit 2); the rerun pushes nothing again and makes it."""
    hub.refuse_collection_writes = 403
    refused = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", hub.url)
    _one_line_error(refused, 2, "collection Cosmos3-Nano-Policy-DROID FP8 of np-cr: ", "the repos were pushed")
    assert list(hub.tags(f"np-cr/{RTN}")) == ["v1.0.0"] and not hub.collections
    hub.refuse_collection_writes = None
    again = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url)
    assert again.exit_code == 0 and "no changes, nothing uploaded" in again.output, again.output
    assert "collection Cosmos3-Nano-Policy-DROID FP8: created (1 repo)" in again.output
