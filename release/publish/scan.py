"""The secret scan of every file a push or a manifest publishes: tokens and private keys in a file's bytes (across
chunk boundaries), in PNG text chunks (compressed ones inflated), in the decoded strings of JSON files and of a
safetensors header, and files named like secrets. A finding is reported redacted: its kind and public prefix only."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Any

from release.core.errors import ReleaseError

SECRET_NAMES = (".env", "*.pem", "*.key", "id_rsa*", "id_ed25519*", ".netrc", "*credentials*", "*.token",
                ".huggingface/*", "token")
# One compiled pattern over whole chunks; minimal matches are at most 67 bytes long. No capturing groups: with them
# the regex engine loses its first-character prefilter and runs 10 times slower (bench/secret_scan.py).
SECRETS = re.compile(rb"hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}"
                     rb"|(?:AKIA|ASIA)[0-9A-Z]{16}|-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----")
# kind by the match's start, and how much of the match is public (its prefix; a key's header line is not secret)
SECRET_KINDS = (("hf_", "Hugging Face token", 3), ("github_pat_", "GitHub token", 11), ("gh", "GitHub token", 4),
                ("AKIA", "AWS access key id", 4), ("ASIA", "AWS access key id", 4), ("-----", "private key", 0))
SCAN_VERSION = 3  # bump when SECRETS changes: cached scan results of older versions are redone
CHUNK = 1 << 24
OVERLAP = 256
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT_LIMIT = 64 << 20  # a compressed PNG text chunk that inflates beyond this is refused, not scanned


class Scanner:
    """Searches SECRETS in a stream of chunks. The last OVERLAP bytes of each chunk are searched again together with
    the start of the next one, so a token across a chunk boundary is found."""

    def __init__(self) -> None:
        self.tail = b""
        self.offset = 0
        self.found: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        if self.found is None:
            for base, text in ((self.offset - len(self.tail), self.tail + chunk[:OVERLAP]), (self.offset, chunk)):
                if m := SECRETS.search(text):
                    self.found = _finding(m, f"at byte {base + m.start()}")
                    break
            self.tail = chunk[-OVERLAP:]
        self.offset += len(chunk)


def _finding(m: re.Match[bytes], where: str) -> dict[str, Any]:
    """The kind of a match and a redacted form of it (its public prefix, never the secret part)."""
    text = m.group().decode("ascii")
    kind, public = next((k, n or len(text)) for prefix, k, n in SECRET_KINDS if text.startswith(prefix))
    return {"kind": kind, "shown": text[:public] + ("…" if public < len(text) else ""), "where": where}


def _json_secret(value: Any, where: str) -> tuple[re.Match[bytes], str] | None:
    """The first secret in the decoded strings (keys and values) of a JSON document, with its path."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if m := SECRETS.search(item.encode("utf-8", "replace")):
                return m, path
        elif isinstance(item, dict):
            for key, sub in item.items():
                stack += [(key, f"{path} (a key)"), (sub, f"{path}.{key}")]
        elif isinstance(item, list):
            stack += [(sub, f"{path}[{i}]") for i, sub in enumerate(item)]
    return None


def _inflate(data: bytes, what: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(data, TEXT_LIMIT)
    except zlib.error as exc:
        raise ReleaseError(f"{what} is not valid zlib data, so it cannot be checked for secrets; remove it") from exc
    if inflater.unconsumed_tail:
        raise ReleaseError(f"{what} inflates to more than {TEXT_LIMIT >> 20} MiB; remove it")
    return text


def _png_secret(path: Path) -> tuple[re.Match[bytes], str] | None:
    """Text chunks of a PNG: tEXt as it is, zTXt and compressed iTXt inflated."""
    with path.open("rb") as f:
        f.seek(len(PNG_MAGIC))
        while len(header := f.read(8)) == 8:
            length, kind = struct.unpack(">I4s", header)
            if kind not in (b"tEXt", b"zTXt", b"iTXt"):
                f.seek(length + 4, os.SEEK_CUR)
                continue
            keyword, _, rest = f.read(length).partition(b"\0")
            f.seek(4, os.SEEK_CUR)  # CRC
            where = f"in PNG chunk {kind.decode()} '{keyword.decode('latin-1')}'"
            if kind == b"zTXt":
                rest = _inflate(rest[1:], f"{path}: PNG chunk zTXt '{keyword.decode('latin-1')}'")
            elif kind == b"iTXt":
                compressed, text = rest[:1] == b"\1", rest[2:].split(b"\0", 2)[-1]
                rest = _inflate(text, f"{path}: PNG chunk iTXt '{keyword.decode('latin-1')}'") if compressed \
                    else text
            if m := SECRETS.search(keyword) or SECRETS.search(rest):
                return m, where
    return None


def structured_secret(path: Path) -> dict[str, Any] | None:
    """Secrets the byte scan cannot see or place: PNG text chunks (compressed ones inflated), the decoded strings of
    JSON files and of a safetensors header (``__metadata__``), with where they are."""
    found: tuple[re.Match[bytes], str] | None = None
    with path.open("rb") as f:
        head = f.read(8)
        if head == PNG_MAGIC:
            found = _png_secret(path)
        elif path.suffix in (".safetensors", ".json"):
            where = "in the safetensors header at $" if path.suffix == ".safetensors" else "in JSON at $"
            try:
                if path.suffix == ".safetensors":
                    (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
                    doc = json.loads(f.read(n)) if 0 < n <= 100_000_000 else None
                else:
                    doc = json.loads(head + f.read())
                found = _json_secret(doc, where) if doc is not None else None
            except ValueError:  # not JSON: verification judges the file, the byte scan has read it
                found = None
            except RecursionError as exc:  # Python's parser and the walk recurse: too deep to read is not scanned
                raise ReleaseError(f"{path}: JSON nested too deeply to scan for secrets; remove it from the "
                                   "folder") from exc
    return _finding(*found) if found else None


def text_secret(data: bytes, json_text: bool) -> dict[str, Any] | None:
    """A secret in a small text held in memory (a sidecar of a release manifest): in its decoded JSON strings
    (``json_text``), else in its bytes."""
    if json_text:
        try:
            found = _json_secret(json.loads(data), "in JSON at $")
        except ValueError:
            found = None
        except RecursionError:
            return {"kind": "JSON nested too deeply to scan", "shown": "…", "where": "in JSON"}
        if found:
            return _finding(*found)
    m = SECRETS.search(data)
    return _finding(m, f"at byte {m.start()}") if m else None


def secret_name(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel.split("/")[-1], p) or fnmatch.fnmatch(rel, p) for p in SECRET_NAMES)
