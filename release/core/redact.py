"""Secrets kept out of what the tool prints: every message built from an exception is scrubbed of the Hub token
(``HF_TOKEN``, also as pieces and as a library escapes it) and of HTTP authorization values, since a client
library's error may quote the headers of its request (``Illegal header value b'Bearer hf_…'``)."""

from __future__ import annotations

import os
import re

TOKEN_ENV = "HF_TOKEN"
REDACTED = "<redacted>"
# an ``Authorization`` header or a bearer credential, as a header line, a dict's repr or a bytes repr quotes it
_AUTHORIZATION = re.compile(r"""(?i)(authorization['"]?\s*[:=]\s*['"]?(?:bearer\s+)?|bearer\s+)[^\s'",;)\]}]+""")
_HF_TOKEN = re.compile(r"hf_[A-Za-z0-9]{30,}")  # the shape of a Hugging Face token, whoever's it is
_PIECE = 6  # the shortest piece of the token removed on its own (a token cut by the whitespace it holds)


def scrub(text: str) -> str:
    """``text`` without the token of ``HF_TOKEN`` (whole, stripped, escaped as ``repr`` escapes it, and each piece
    between its whitespace), authorization values and anything shaped like a Hugging Face token."""
    token = os.environ.get(TOKEN_ENV, "")
    pieces = {token, token.strip(), repr(token)[1:-1], *token.split()}
    for piece in sorted((p for p in pieces if len(p) >= _PIECE), key=len, reverse=True):
        text = text.replace(piece, REDACTED)
    text = _AUTHORIZATION.sub(lambda m: m[1] + REDACTED, text)
    return _HF_TOKEN.sub(REDACTED, text)
