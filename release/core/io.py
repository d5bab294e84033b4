"""File helpers shared by the stages: the package's data folders, atomic outputs, JSON, hashing."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from release.core.errors import ReleaseError

# The card templates, the catalogs and the default build files: inside an installed wheel they sit in the package
# (``setup.py`` copies the checkout's top-level folders there when it builds one); in a checkout or an editable
# install, the checkout's own folders are used.
PACKAGE = Path(__file__).resolve().parents[1]
PACKAGE_DATA = PACKAGE / "_data"
CHECKOUT = PACKAGE.parent


def data_path(name: str) -> Path:
    """``templates``, ``locales`` or ``builds``: the wheel's copy, else the checkout's."""
    packaged = PACKAGE_DATA / name
    return packaged if packaged.is_dir() else CHECKOUT / name


def tool_commit() -> str:
    """The tool's own commit: what the wheel recorded when it was built (``_data/commit``, written by setup.py from
    the checkout it was built in), else the HEAD of the git checkout the package runs from (an editable install),
    else "unknown". A package installed inside someone else's repository is not that repository's commit: the
    checkout must be this package's own top level."""
    import subprocess

    recorded = PACKAGE_DATA / "commit"
    if recorded.is_file():
        return recorded.read_text(encoding="utf-8").strip() or "unknown"
    try:
        out = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, check=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out[1] if len(out) == 2 and Path(out[0]).resolve() == CHECKOUT.resolve() else "unknown"

# What ``atomic_dir`` / ``replace_dir`` leave beside ``final`` while they run: ``.<name>.<kind>-<pid>-<random>``.
# tmp: the new folder being written (or, after an exchange, the old one being deleted); old: the whole old folder,
# renamed aside for a moment; del: the old folder being deleted.
_SIBLING = re.compile(r"(tmp|old|del)-(\d+)-[0-9a-f]+")


def _sibling(final: Path, kind: str) -> Path:
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where the C library, the
    kernel or the file system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if sys.platform == "linux" else None
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def clean_stale(final: Path) -> None:
    """Tidy up after earlier runs on ``final`` that were killed: only this output's temporaries, only those whose
    process is gone (a running build or push keeps its own).

    A run killed between moving the old folder aside and the new one in leaves no ``final`` but the whole old folder
    as ``.<name>.old-...``: it is renamed back first. Everything else is a partial new folder, or an old one whose
    replacement is in place, and is deleted.
    """
    if not final.parent.is_dir():
        return
    prefix = f".{final.name}."
    stale: list[tuple[str, Path]] = []
    for path in final.parent.iterdir():
        match = _SIBLING.fullmatch(path.name[len(prefix):]) if path.name.startswith(prefix) else None
        if match and not _alive(int(match[2])):
            stale.append((match[1], path))
    olds = [path for kind, path in stale if kind == "old"]
    if olds and not (final.exists() or final.is_symlink()):
        os.rename(max(olds, key=lambda p: p.stat().st_ctime), final)
    for _, path in stale:
        if path.exists() or path.is_symlink():
            _remove(path)


def replace_dir(src: Path, final: Path) -> None:
    """Move the complete folder ``src`` (a sibling of ``final``) to ``final``, replacing what is there, so that
    ``final`` holds at every instant either all of the old folder or all of the new one.

    On Linux the two are exchanged in one system call and the old folder, now at ``src``, is deleted. Where the file
    system cannot exchange, the old folder is renamed aside (``.<name>.old-<pid>-<random>``), ``src`` is renamed in,
    then the old folder is deleted. Between those two renames ``final`` is absent for an instant but the old folder
    is whole under that name, and ``clean_stale`` (the next ``atomic_dir`` on ``final``) puts it back.
    """
    if not (final.exists() or final.is_symlink()):
        os.rename(src, final)
        return
    if _exchange(src, final):
        _remove(src)  # the old folder
        return
    old = _sibling(final, "old")
    os.rename(final, old)
    try:
        os.rename(src, final)
    except BaseException:
        os.rename(old, final)
        raise
    gone = _sibling(final, "del")  # an "old" name only ever holds a whole folder
    os.rename(old, gone)
    _remove(gone)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a new folder beside ``final``; put it in place of ``final`` (``replace_dir``) only if the block succeeds.

    A failure (or Ctrl-C, or SIGTERM) removes the new folder and leaves ``final`` as it was; what a killed earlier run
    left is cleaned first (``clean_stale``).
    """
    created = not final.parent.exists()
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(final)
    tmp = _sibling(final, "tmp")
    tmp.mkdir()
    ok = False
    try:
        yield tmp
        replace_dir(tmp, final)
        ok = True
    except Exception as exc:
        _refuse_full_disk(final, tmp, exc)  # said before the partial folder is removed: then the disk has room again
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok and created and not any(final.parent.iterdir()):
            final.parent.rmdir()  # the failed run created the output folder: leave no trace


FULL_DISK = 64 * 2**20  # less free than this after a write failed: the disk was full (torch.save does not say so)


def disk_full(path: Path, exc: BaseException) -> str | None:
    """How full the disk of ``path`` is, when ``exc`` came from a full disk: an OSError ENOSPC or EDQUOT anywhere in
    its chain, the same error as safetensors words it, or less than ``FULL_DISK`` left (torch.save's own words say
    only that its write failed); else None."""
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in chain:
        chain.append(link)
        link = link.__cause__ or link.__context__
    said = any((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or "os error 28" in str(e)
               or "No space left on device" in str(e) for e in chain)
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "no space left" if said else None
    return f"{free / 2**20:.0f} MiB free" if said or free < FULL_DISK else None


def _refuse_full_disk(final: Path, written: Path, exc: BaseException) -> None:
    """A one-line error naming ``final`` when writing ``written`` failed on a full disk (:func:`disk_full`)."""
    full = disk_full(written, exc)
    if full is not None:
        raise ReleaseError(f"{final}: the disk ran out of space while it was written ({full}); free space on it or "
                           "write the outputs to another disk") from exc


TEMPORARY = re.compile(r"\.(.+)\.(\d+)\.tmp")  # .NAME.PID.tmp: what a writer of NAME killed by SIGKILL leaves


def left_by(rel: str) -> str | None:
    """The file whose temporary ``rel`` is (:func:`_open_temporary`'s name), when its writer is no longer running."""
    match = TEMPORARY.fullmatch(Path(rel).name)
    return str(Path(rel).with_name(match[1])) if match and not _alive(int(match[2])) else None


def _open_temporary(path: Path) -> tuple[Path, BinaryIO]:
    """A new temporary beside ``path``, this process's, opened exclusively and never through a link (a link planted
    at its name is refused; one at another name is never touched). The temporaries of ``path`` that processes no
    longer running left (killed while writing it) are removed first."""
    prefix = f".{path.name}."
    with os.scandir(path.parent) as entries:
        for entry in entries:
            pid = entry.name[len(prefix):-len(".tmp")] if entry.name.startswith(prefix) else ""
            if entry.name.endswith(".tmp") and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                Path(entry.path).unlink(missing_ok=True)  # a link is removed, never followed
    tmp = path.with_name(f"{prefix}{os.getpid()}.tmp")
    if tmp.is_symlink():
        raise ReleaseError(f"{tmp}: a link where this command writes a temporary; remove it")
    tmp.unlink(missing_ok=True)  # this pid's, from an earlier run that was killed
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        return tmp, os.fdopen(fd, "wb")
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """A file to write ``path``'s new content to (``torch.save``, ``np.save``), renamed over ``path`` when the block
    ends: ``path`` holds the new content whole or its old one. A failure removes the temporary (a full disk: a
    one-line error naming ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, file = _open_temporary(path)
    try:
        with file:
            yield file
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception):
            _refuse_full_disk(path, tmp, exc)
        raise
    os.replace(tmp, path)


def atomic_write(path: Path, data: bytes | str) -> None:
    """``path`` holds ``data`` whole, or its old content (:func:`replacing`)."""
    with replacing(path) as file:
        file.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT held back while a set of outputs is renamed into place (a few system calls), then acted on:
    either signal leaves the whole old set or the whole new one (SIGKILL cannot be held: the readers of a set check
    its hashes). Only in the main thread, where Python runs signal handlers."""
    held = [sig for sig in (signal.SIGTERM, signal.SIGINT) if signal.getsignal(sig) is not None]
    if threading.current_thread() is not threading.main_thread():
        held = []
    caught: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])


def write_set(files: dict[Path, bytes | str]) -> None:
    """Write several outputs as one set (a card's READMEs, LICENSE and plots): every file to a temporary of this
    process first (:func:`_open_temporary`), then each renamed over its name. A failure while writing, a full disk
    above all, removes the temporaries and leaves every old file as it was (a one-line error naming the file on a
    full disk); the renames need no space."""
    staged: list[tuple[Path, Path]] = []
    path = tmp = next(iter(files), Path("."))
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp, file = _open_temporary(path)
            staged.append((tmp, path))
            with file:
                file.write(data.encode() if isinstance(data, str) else data)
        with _signals_held():
            for written, final in staged:
                os.replace(written, final)
    except BaseException as exc:  # also SIGTERM and Ctrl-C (KeyboardInterrupt): no temporary is left behind
        for written, _ in staged:
            written.unlink(missing_ok=True)  # those renamed already are gone under this name
        if isinstance(exc, Exception):
            _refuse_full_disk(path, tmp, exc)
        raise


def keep_cached(path: Path, data: bytes) -> bool:
    """Write a cache entry whole or not at all (:func:`write_set`). False when it could not be kept (a full or
    read-only cache, a link in the way): a cache entry that is not kept only costs the next run its work."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_set({path: data})
        return True
    except (OSError, ReleaseError):
        return False


def json_text(obj: Any) -> str:
    """The tool's JSON files as text: indented, keys sorted (the same object, the same bytes)."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def json_digest(obj: Any) -> str:
    """A short key of a JSON-able object (settings a cache entry or a journal step depends on)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json_text(obj))


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block, its holder's pid written in it.

    While another process (or another open of the file) holds it, fail at once with a one-line error naming that
    pid. The kernel releases the lock when its holder exits, however it exits: a stale lock file locks nothing.
    """
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a link: the pid written below would truncate the file it points to
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise ReleaseError(f"{path}: a link where {what} keeps its lock file; remove it") from None
    try:
        if os.fstat(fd).st_nlink > 1:
            raise ReleaseError(f"{path}: the lock file has other names (a hard link); remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ReleaseError(f"another {what} is running (pid {pid}); wait for it to finish, then run again") \
                from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


MAX_JSON_BYTES = 256 * 2**20  # the largest file a stage writes (tables, reports, manifests) is a few MB


def parse_json(data: bytes | str, where: str, fix: str, what: str | None = None) -> Any:
    """``data`` (read from ``where``) parsed as JSON: the one entry every JSON file the tool reads goes through.
    Over ``MAX_JSON_BYTES``, not UTF-8, invalid, or nested too deeply to parse (Python's parser recurses: 100,000
    levels is a RecursionError) is a one-line error naming ``where`` (and ``what`` it is) and saying ``fix``."""
    about = f"{what}: " if what else ""
    if len(data) > MAX_JSON_BYTES:
        raise ReleaseError(f"{where}: {len(data):,} bytes, more than the {MAX_JSON_BYTES:,} a JSON file here can "
                           f"hold ({about.removesuffix(': ') or 'JSON'}); {fix}")
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise ReleaseError(f"{where}: not valid JSON ({about}{exc.msg} at line {exc.lineno} column {exc.colno}); "
                           f"{fix}") from exc
    except ValueError as exc:  # bytes that are not UTF-8
        raise ReleaseError(f"{where}: not valid JSON ({about}not UTF-8 text); {fix}") from exc
    except RecursionError as exc:
        raise ReleaseError(f"{where}: nested too deeply to read{f' ({what})' if what else ''}; {fix}") from exc


def read_json(path: Path, what: str, command: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON object another stage wrote at ``path``, with the ``required`` top-level fields; missing, not JSON,
    not an object or without a required field is a one-line error that names ``path`` and ``command``, the command
    that (re)writes it."""
    if not path.is_file():
        raise ReleaseError(f"{path}: missing ({what}); run '{command}' first")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ReleaseError(f"{path}: {path.stat().st_size:,} bytes, more than the {MAX_JSON_BYTES:,} a {what} file "
                           f"can hold; run '{command}' to rewrite it")
    doc = parse_json(path.read_bytes(), str(path), f"run '{command}' to rewrite it", what)
    if not isinstance(doc, dict):
        raise ReleaseError(f"{path}: expected a JSON object ({what}), got {type(doc).__name__}; run '{command}' to "
                           "rewrite it")
    for key in required:
        if key not in doc:
            raise ReleaseError(f"{path}: field '{key}' is missing ({what}); run '{command}' to rewrite it")
    return doc


def output_folder(path: Path, option: str = "--out") -> Path:
    """``path`` if it is a folder or can become one; a file at it or above it is a one-line error, raised before any
    work starts rather than when the first output is written."""
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise ReleaseError(f"{option} {path}: {p} exists and is not a folder; choose another {option}")
            break
    return path


def replaceable_folder(path: Path, option: str, ours: frozenset[str]) -> Path:
    """An output folder that a command replaces whole (``atomic_dir``): it may be missing, empty, or hold only the
    entries the command itself writes (``ours``: a previous run's). A folder holding anything else (a user's files),
    or the current folder or one above it (which cannot be swapped), is a one-line error before any work."""
    output_folder(path, option)
    if not path.exists():
        return path
    if path.is_symlink():
        raise ReleaseError(f"{option} {path}: a link; give a real folder (it is replaced whole)")
    if path.resolve() in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
        raise ReleaseError(f"{option} {path}: the current folder or one above it, which this command would replace "
                           f"whole; give a new folder, e.g. {option} preview")
    others = sorted(p.name for p in path.iterdir() if p.name not in ours)
    if others:
        raise ReleaseError(f"{option} {path}: holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, "
                           "which this command did not write, and it replaces the folder whole; give a new or empty "
                           "folder")
    return path


CACHE_ENV = "RELEASE_CACHE"


def cache_dir() -> Path:
    """Where calibration captures, rollouts, frames' VAE encodes and file hashes are kept: ``RELEASE_CACHE``,
    default ``.cache/release``."""
    return Path(os.environ.get(CACHE_ENV, ".cache/release"))


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_compiles() -> None:
    """torch.compile's caches (inductor's compiled graphs, Triton kernels, autotuning results) in the tool's cache
    folder, unless ``TORCHINDUCTOR_CACHE_DIR`` is set: the yardstick's compiled rollouts and ModelOpt's compiled FP8
    GEMM are compiled once and then read back by every later process that shares the cache folder (torch's default
    is a folder under /tmp)."""
    os.environ.setdefault(INDUCTOR_CACHE_ENV, str((cache_dir() / "torchinductor").resolve()))


LAST_EPOCH = 253_402_300_799  # 9999-12-31T23:59:59Z, the last second an ISO date (and Python's datetime) can hold


def build_date(inputs: str | None = None) -> str:
    """``SOURCE_DATE_EPOCH`` where set, else ``inputs`` (the date of the inputs an output is derived from, so that the
    same inputs give the same bytes: the tables take their builds' latest, the selection its tables'), else the UTC
    time of this run."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and not (epoch.isascii() and epoch.isdigit() and int(epoch) <= LAST_EPOCH):
        raise ReleaseError(f"SOURCE_DATE_EPOCH={epoch[:40]!r}: must be whole seconds since 1970 up to {LAST_EPOCH} "
                           "(the end of year 9999), e.g. $(date +%s)")
    if not epoch and inputs is not None:
        return inputs
    when = datetime.fromtimestamp(int(epoch), UTC) if epoch else datetime.now(UTC)
    return when.replace(microsecond=0).isoformat()


def canonical_modelopt_state(state: dict[str, Any]) -> dict[str, Any]:
    """ModelOpt's state with each quantizer's properties in sorted order, so that the same build pickles the same.

    ModelOpt collects a quantizer's properties from a set difference of attribute names
    (``TensorQuantizer._get_properties_for_modelopt_state``): their order follows Python's string hashing, which
    changes with every process (``PYTHONHASHSEED``). Restoring sets them by name, so the order carries nothing.
    """
    for _, mode in state["modelopt_state_dict"]:
        for key in ("quantizer_state", "real_quantizer_state"):
            per_quantizer = mode["metadata"].get(key, {})
            for name, properties in per_quantizer.items():
                per_quantizer[name] = dict(sorted(properties.items()))
    return state
