"""The secret scan of every file a push or a manifest publishes: tokens and private keys in a file's bytes (across
chunk boundaries), in PNG text chunks (compressed ones inflated), in the decoded strings of JSON files and of a
safetensors header, and files named like secrets. A finding is reported redacted: its kind and public prefix only."""

from __future__ import annotations

import base64
import fnmatch
import gzip
import html
import json
import os
import re
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from release.core.builds import load_yaml
from release.core.errors import ReleaseError

SECRET_NAMES = (".env", "*.pem", "*.key", "id_rsa*", "id_ed25519*", ".netrc", "*credentials*", "*.token",
                ".huggingface/*", "token")
# The secrets, as (prefixes, the class of the characters that follow, how many at least, at most): a Hugging Face
# token, GitHub tokens, an AWS access key id, and the header line of a private key (PEM, PKCS#8, OpenSSH, PGP).
TOKENS: tuple[tuple[tuple[bytes, ...], bytes, int, int | None], ...] = (
    ((b"hf_",), b"A-Za-z0-9", 30, None),
    ((b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_"), b"A-Za-z0-9", 36, None),
    ((b"github_pat_",), b"A-Za-z0-9_", 22, None),
    ((b"AKIA", b"ASIA"), b"0-9A-Z", 16, 16),
)
KEY_HEADER = rb"-----BEGIN [A-Z ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
B64 = rb"[A-Za-z0-9+/]"


def _pattern(width: int) -> bytes:
    """The secrets in text whose characters are ``width`` bytes wide: 1 (ASCII, UTF-8), 2 (UTF-16, either byte
    order: from the first character on, big-endian text reads as little-endian) or 4 (UTF-32)."""
    pad = b"\x00" * (width - 1)

    def lit(text: bytes) -> bytes:
        return b"".join(re.escape(bytes([c])) + pad for c in text)

    def run(cls: bytes, low: int, high: int | None) -> bytes:
        return b"(?:[" + cls + b"]" + pad + b"){%d,%s}" % (low, b"" if high is None else b"%d" % high)

    forms = [b"(?:" + b"|".join(lit(p) for p in prefixes) + b")" + run(cls, low, high)
             for prefixes, cls, low, high in TOKENS]
    forms.append(lit(b"-----BEGIN ") + run(b"A-Z ", 0, 40) + lit(b"PRIVATE KEY") + b"(?:" + lit(b" BLOCK") + b")?"
                 + lit(b"-----"))
    return b"|".join(forms)


def _base64_forms(prefix: bytes) -> list[bytes]:
    """The base64 characters that encode ``prefix`` whatever precedes it, for each of its 3 alignments."""
    forms = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + prefix + b"\0\0\0")
        forms.append(encoded[-(-k * 8 // 6):(k + len(prefix)) * 8 // 6])
    return forms


# The secrets as ASCII (and UTF-8), UTF-16 and UTF-32. No capturing groups: with them the regex engine loses its
# first-character prefilter and runs 10 times slower (bench/secret_scan.py).
SECRETS = re.compile(_pattern(1))
WIDE = {2: re.compile(_pattern(2)), 4: re.compile(_pattern(4))}
PREFIXES = [*(p for prefixes, *_ in TOKENS for p in prefixes), b"-----BEGIN "]


def _wide(text: bytes, width: int) -> bytes:
    return b"".join(bytes([c]) + b"\x00" * (width - 1) for c in text)


# What a search looks for first: every prefix as it is, as UTF-16 and UTF-32, and its base64 forms, all literals
# (a set of literals is searched about 7 times faster than the patterns themselves); each hit is then matched in
# full, or, for base64, its run decoded.
KIND_OF = {**{p: 1 for p in PREFIXES}, **{_wide(p, w): w for p in PREFIXES for w in (2, 4)},
           **{f: 0 for p in PREFIXES for f in _base64_forms(p)}}
CANDIDATES = re.compile(b"|".join(re.escape(k) for k in sorted(KIND_OF, key=len, reverse=True)))
SECRET_KINDS = (("hf_", "Hugging Face token", 3), ("github_pat_", "GitHub token", 11), ("gh", "GitHub token", 4),
                ("AKIA", "AWS access key id", 4), ("ASIA", "AWS access key id", 4), ("-----", "private key", 0))
SCAN_VERSION = 4  # bump when the patterns change: cached scan results of older versions are redone
CHUNK = 1 << 24
OVERLAP = 1024  # the longest minimal match: a UTF-32 key header or token, or a base64 run that encodes one
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT_LIMIT = 64 << 20  # a compressed part (PNG chunk, zip member, gzip) that inflates beyond this is refused


RUN = re.compile(B64 + b"+")
RUN_BEFORE = re.compile(B64 + b"{1,65536}$")  # the part of a base64 run before a hit (searched up to the hit)


def search(data: bytes) -> tuple[bytes, int, str] | None:
    """The first secret in ``data``: the secret (as ASCII), where it starts, and how it was written (``""``, ``" in
    UTF-16"``, ``" in base64"``...); None when there is none. A base64 candidate counts only when its run decodes,
    at one of its alignments, to bytes holding a secret; each run is decoded once."""
    decoded_to = 0  # the end of the last base64 run decoded
    for m in CANDIDATES.finditer(data):
        width = KIND_OF[m.group()]
        if width == 1:
            if full := SECRETS.match(data, m.start()):
                return full.group(), m.start(), ""
        elif width:
            if full := WIDE[width].match(data, m.start()):
                return full.group().replace(b"\x00", b""), m.start(), f" in UTF-{8 * width}"
        elif m.start() >= decoded_to:
            before = RUN_BEFORE.search(data, max(0, m.start() - 65536), m.start())
            run = RUN.match(data, before.start() if before else m.start())
            assert run is not None
            decoded_to = run.end()
            if (secret := _decoded_base64(run.group())) is not None:
                return secret, run.start(), " in base64"
    return None


def _decoded_base64(run: bytes) -> bytes | None:
    """The secret in a base64 run, decoded at each of its alignments, or None."""
    for k in range(4):
        usable = run[k:][: (len(run) - k) // 4 * 4]
        try:
            plain = base64.b64decode(usable, validate=True)
        except ValueError:
            continue
        if m := SECRETS.search(plain):
            return m.group()
    return None


WEIGHTS = (".safetensors",)  # their data is searched as ASCII only: 16 GB of weights at the decoding scan's cost
# would take several minutes per repo (BENCHMARKS.md); their header is parsed and decoded (structured_secret)


class Scanner:
    """Searches the secrets in a stream of chunks (``decode``: in every encoding :func:`search` knows, else as
    ASCII). The last OVERLAP bytes of each chunk are searched again together with the start of the next one, so a
    secret across a chunk boundary is found."""

    def __init__(self, decode: bool = True) -> None:
        self.decode = decode
        self.tail = b""
        self.offset = 0
        self.hit: tuple[bytes, str] | None = None  # the secret and where it is
        self.found: dict[str, Any] | None = None  # its redacted finding

    def _search(self, text: bytes) -> tuple[bytes, int, str] | None:
        if self.decode:
            return search(text)
        m = SECRETS.search(text)
        return (m.group(), m.start(), "") if m else None

    def feed(self, chunk: bytes) -> None:
        if self.found is None:
            for base, text in ((self.offset - len(self.tail), self.tail + chunk[:OVERLAP]), (self.offset, chunk)):
                if hit := self._search(text):
                    secret, at, how = hit
                    self.hit = secret, f"at byte {base + at}{how}"
                    self.found = finding(*self.hit)
                    break
            self.tail = chunk[-OVERLAP:]
        self.offset += len(chunk)


def finding(secret: bytes, where: str) -> dict[str, Any]:
    """The kind of a secret and a redacted form of it (its public prefix, never the secret part)."""
    text = secret.decode("ascii")
    kind, public = next((k, n or len(text)) for prefix, k, n in SECRET_KINDS if text.startswith(prefix))
    return {"kind": kind, "shown": text[:public] + ("…" if public < len(text) else ""), "where": where}


Found = tuple[bytes, str]  # a secret (as ASCII) and where it is


def _in(data: bytes, where: str) -> Found | None:
    hit = search(data)
    return (hit[0], f"{where}{hit[2]}") if hit else None


def _json_secret(value: Any, where: str) -> Found | None:
    """The first secret in the decoded strings (keys and values) of a JSON or YAML document, with its path."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if found := _in(item.encode("utf-8", "replace"), path):
                return found
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


CRITICAL_PNG = (b"IHDR", b"PLTE", b"IDAT", b"IEND")


def _png_secret(path: Path) -> Found | None:
    """The chunks of a PNG but its image data: text chunks (tEXt as it is, zTXt and compressed iTXt inflated), the
    ICC profile (iCCP, inflated) and every other ancillary or private chunk, as it is and inflated where it is zlib
    data; each searched as text of any width and as base64."""
    with path.open("rb") as f:
        f.seek(len(PNG_MAGIC))
        while len(header := f.read(8)) == 8:
            length, kind = struct.unpack(">I4s", header)
            if kind in CRITICAL_PNG:
                f.seek(length + 4, os.SEEK_CUR)
                continue
            data = f.read(length)
            f.seek(4, os.SEEK_CUR)  # CRC
            name = kind.decode("latin-1")
            keyword, _, rest = data.partition(b"\0")
            what = f"{path}: PNG chunk {name} '{keyword.decode('latin-1')}'"
            where = f"in PNG chunk {name} '{keyword.decode('latin-1')}'"
            if kind in (b"zTXt", b"iCCP"):
                rest = _inflate(rest[1:], what)
            elif kind == b"iTXt":
                compressed, text = rest[:1] == b"\1", rest[2:].split(b"\0", 2)[-1]
                rest = _inflate(text, what) if compressed else text
            elif kind not in (b"tEXt",):
                where, rest = f"in PNG chunk {name}", data
                if data[:1] == b"\x78":  # a zlib stream, perhaps: searched inflated too
                    try:
                        rest = data + _inflate(data, what)
                    except ReleaseError:
                        pass
            if found := _in(keyword, where) or _in(rest, where):
                return found
    return None


ARCHIVE_LIMIT = 1 << 30  # what the members of one zip or gzip file may inflate to in all, to be scanned


def _stream_secret(chunks: Any, where: str) -> Found | None:
    """A secret in a stream of byte chunks (an archive member), through :class:`Scanner`."""
    scanner, total = Scanner(), 0
    for chunk in chunks:
        total += len(chunk)
        if total > ARCHIVE_LIMIT:
            raise ReleaseError(f"{where} inflates to more than {ARCHIVE_LIMIT >> 30} GiB, so it cannot be checked "
                               "for secrets; remove it")
        scanner.feed(chunk)
        if scanner.hit:
            return scanner.hit[0], f"{where}, {scanner.hit[1]}"
    return None


def _archive_secret(path: Path, head: bytes) -> Found | None:
    """The members of a zip (an npz: ``savez_compressed`` deflates them) or the content of a gzip file, inflated,
    whatever the file's name."""
    def reads(f: Any) -> Any:
        while block := f.read(CHUNK):
            yield block

    try:
        if head.startswith(b"PK\x03\x04"):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    with z.open(info) as member:
                        if found := _stream_secret(reads(member), f"in zip member {info.filename!r}"):
                            return found
        elif head.startswith(b"\x1f\x8b"):
            with gzip.open(path, "rb") as f:
                return _stream_secret(reads(f), "in the gzip data")
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError) as exc:
        raise ReleaseError(f"{path}: a damaged archive ({type(exc).__name__}), so it cannot be checked for secrets; "
                           "remove it") from exc
    return None


TEXT_SUFFIXES = (".md", ".po", ".txt", ".yaml", ".yml", ".json", ".html", ".csv", ".py", ".cfg", ".toml")


def _text_secret(path: Path, data: bytes) -> Found | None:
    """A text file's secrets once decoded as a reader decodes it: HTML entities (the Hub renders ``&#104;f_`` as
    ``hf_``), percent-escapes, and for YAML the strings ``yaml.safe_load`` makes of its escapes (``\\x68f_``)."""
    text = data.decode("utf-8", "replace")
    for name, view in (("HTML entities decoded", html.unescape(text)), ("percent-escapes decoded", unquote(text))):
        if view != text and (found := _in(view.encode("utf-8", "replace"), f"in the text with {name}")):
            return found
    if path.suffix in (".yaml", ".yml"):
        try:
            doc: Any = load_yaml(path)[0]  # bounded: a YAML bomb is not expanded
        except ReleaseError:
            doc = None  # not a mapping this tool reads: the byte scan has read it
        return _json_secret(doc, "in YAML at $") if doc is not None else None
    return None


def structured_secret(path: Path) -> dict[str, Any] | None:
    """Secrets the byte scan cannot see or place: in PNG chunks (compressed ones inflated), zip members and gzip
    data (inflated), the decoded strings of JSON and YAML files and of a safetensors header (``__metadata__``), and
    text as a reader decodes it (HTML entities, percent-escapes); with where they are."""
    found: Found | None = None
    with path.open("rb") as f:
        head = f.read(8)
        if head == PNG_MAGIC:
            found = _png_secret(path)
        elif head.startswith((b"PK\x03\x04", b"\x1f\x8b")):
            found = _archive_secret(path, head)
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
        if found is None and (path.suffix in TEXT_SUFFIXES or path.name == "LICENSE") \
                and path.stat().st_size <= TEXT_LIMIT:
            f.seek(0)
            found = _text_secret(path, f.read())
    return finding(*found) if found else None


def text_secret(data: bytes, json_text: bool) -> dict[str, Any] | None:
    """A secret in a small text held in memory (a sidecar of a release manifest): in its decoded JSON strings
    (``json_text``), else in its bytes."""
    if json_text:
        try:
            found = _json_secret(json.loads(data), "in JSON at $")
        except (ValueError, RecursionError):  # not JSON, or too deep to read: its reader names it; the bytes are
            found = None  # searched below
        if found:
            return finding(*found)
    hit = search(data)
    return finding(hit[0], f"at byte {hit[1]}{hit[2]}") if hit else None


def secret_name(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel.split("/")[-1], p) or fnmatch.fnmatch(rel, p) for p in SECRET_NAMES)
