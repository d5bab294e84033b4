"""The HTTP client huggingface_hub uses for a push, installed through its ``set_client_factory``: bounds on every Hub
request, and the token checked before the first.

- Timeouts: connecting, each read, each write and waiting for a pooled connection take at most ``RELEASE_HUB_TIMEOUT``
  seconds (default 60) on every request; huggingface_hub's own shorter ones stay (``HF_HUB_ETAG_TIMEOUT`` for a
  file's metadata, ``HF_HUB_DOWNLOAD_TIMEOUT`` for downloads; 10 s by default).
- Deadlines (``deadline``): the plan of a repo, and each step of a push around its commit, ends within
  ``RELEASE_HUB_DEADLINE`` seconds (default 300), also against a server that answers a byte at a time: when it
  passes, the client's connections are shut (they are known through httpcore's ``trace`` extension) and every
  later request is refused. The commit itself (uploads of any size) is bounded by the timeouts alone.
- Answers: what the Hub answers besides file downloads (``/resolve/``: streamed to disk) is JSON a few hundred KB
  long; one over ``MAX_ANSWER`` (64 MiB) is refused by its ``Content-Length`` unread, or when the bytes read pass it.
- Redirects: a request redirected to another host (scheme, host, port) is refused before anything is sent there;
  only downloads of file content may go to another host (the Hub's CDN, without the token: httpx drops it).

Each refusal is an ``httpx2.TransportError`` (``HubRefusal``): huggingface_hub neither retries it nor falls back to
its cache, and its message names the request.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx2

from release.core.errors import ReleaseError
from release.core.redact import TOKEN_ENV

TIMEOUT_ENV = "RELEASE_HUB_TIMEOUT"
DEADLINE_ENV = "RELEASE_HUB_DEADLINE"
DEFAULTS = {TIMEOUT_ENV: 60.0, DEADLINE_ENV: 300.0}
MAX_ANSWER = 64 * 2**20
TIMEOUTS = ("connect", "read", "write", "pool")
_PORTS = {"http": 80, "https": 443}
_MARGIN = 0.25  # a timeout cut to a deadline's end lasts this much longer: the deadline, not the timeout, says why


class HubRefusal(httpx2.TransportError):
    """A Hub request this client refused or cut: past its deadline, an answer too large, a redirect off the host."""


@dataclass
class _Scope:
    what: str
    seconds: float
    until: float
    last: str = "its first request"
    done: bool = False


@dataclass
class _State:
    installed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    streams: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)  # the client's open network streams


_STATE = _State()
_SCOPE: ContextVar[_Scope | None] = ContextVar("release_hub_deadline", default=None)


def _seconds(name: str) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else DEFAULTS[name]
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ReleaseError(f"{name}={raw}: expected seconds, a positive number (default {DEFAULTS[name]:g})")
    return value


def token() -> str | None:
    """The token of ``HF_TOKEN`` (None when unset or empty: huggingface_hub's login then), refused before any request
    when it holds whitespace, a control character or anything but printable ASCII; never echoed."""
    value = os.environ.get(TOKEN_ENV) or None
    if value is not None and not all("!" <= c <= "~" for c in value):
        raise ReleaseError(f"{TOKEN_ENV} holds whitespace, a control character or a non-ASCII character (a trailing "
                           "carriage return from a file saved with CRLF line ends, a newline); nothing was sent: set "
                           f"it to the token alone, e.g. {TOKEN_ENV}=\"$(tr -d '[:space:]' < FILE)\"")
    return value


def install() -> None:
    """Check the bounds in the environment (read again by each request and deadline) and make huggingface_hub use
    this module's client."""
    from huggingface_hub import set_client_factory

    for name in (TIMEOUT_ENV, DEADLINE_ENV):
        _seconds(name)  # refused here, before any request, when not seconds
    if not _STATE.installed:
        set_client_factory(_client)
        _STATE.installed = True


def _client() -> httpx2.Client:
    """huggingface_hub's own client (its request hook: offline mode, request ids) with this module's bounds."""
    from huggingface_hub.utils._http import hf_request_event_hook

    return httpx2.Client(event_hooks={"request": [hf_request_event_hook, _on_request], "response": [_on_response]},
                         follow_redirects=True, timeout=None)


def _call(request: httpx2.Request) -> str:
    """The request in words: method and URL, without its query or credentials."""
    url = request.url
    port = f":{url.port}" if url.port else ""
    return f"{request.method} {url.scheme}://{url.host}{port}{url.path}"


def _origin(url: httpx2.URL) -> tuple[str, str, int]:
    return url.scheme, url.host.lower(), url.port or _PORTS.get(url.scheme, 0)


def _download(request: httpx2.Request) -> bool:
    """A download of file content: streamed to disk by huggingface_hub, and served from a CDN by the Hub."""
    return request.method in ("GET", "HEAD") and "/resolve/" in request.url.path


def _expired(scope: _Scope) -> str:
    return f"{scope.what} took over {scope.seconds:g} s ({DEADLINE_ENV} raises it), at {scope.last}"


def _on_request(request: httpx2.Request) -> None:
    """Every timeout at most ``RELEASE_HUB_TIMEOUT`` and, in a deadline, what is left of it; the client's connections
    traced; JSON answers asked for uncompressed, so that the bytes counted are the bytes kept."""
    scope, limit = _SCOPE.get(), _seconds(TIMEOUT_ENV)
    if scope is not None:
        left = scope.until - time.monotonic()
        if left <= 0:
            raise HubRefusal(_expired(scope), request=request)
        scope.last, limit = _call(request), min(limit, left + _MARGIN)
    given = request.extensions.get("timeout") or {}
    request.extensions["timeout"] = {k: limit if given.get(k) is None else min(given[k], limit) for k in TIMEOUTS}
    request.extensions["trace"] = _trace
    if not _download(request):
        request.headers["Accept-Encoding"] = "identity"


def _trace(event: str, info: dict[str, Any]) -> None:
    if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
        with _STATE.lock:
            _STATE.streams.add(info["return_value"])


def _on_response(response: httpx2.Response) -> None:
    request = response.request
    if response.has_redirect_location and not _download(request):
        target = request.url.join(response.headers["Location"])
        if _origin(target) != _origin(request.url):
            raise HubRefusal(f"{_call(request)}: redirected to another host ({target.scheme}://{target.netloc.decode()}"
                             "); refused before anything was sent there: check --endpoint (the Hub's own address)",
                             request=request)
    if _download(request):
        return
    length = response.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > MAX_ANSWER:
        raise HubRefusal(f"{_call(request)}: an answer of {int(length):,} bytes (Content-Length), over the "
                         f"{MAX_ANSWER:,} a Hub answer may have; refused unread: check --endpoint", request=request)
    assert isinstance(response.stream, httpx2.SyncByteStream)  # a sync client's
    response.stream = _Bounded(response.stream, request)


class _Bounded(httpx2.SyncByteStream):
    """An answer's bytes, refused once more than ``MAX_ANSWER`` have come (an answer without a length)."""

    def __init__(self, stream: httpx2.SyncByteStream, request: httpx2.Request) -> None:
        self.stream, self.request = stream, request

    def __iter__(self) -> Iterator[bytes]:
        seen = 0
        for chunk in self.stream:
            seen += len(chunk)
            if seen > MAX_ANSWER:
                raise HubRefusal(f"{_call(self.request)}: an answer over {MAX_ANSWER:,} bytes, more than a Hub answer "
                                 "may have; refused at that size: check --endpoint", request=self.request)
            yield chunk

    def close(self) -> None:
        self.stream.close()


def _cut(scope: _Scope) -> None:
    """The deadline passed: shut every connection of the client (a read blocked on one returns at once)."""
    with _STATE.lock:
        if scope.done:
            return
        streams = list(_STATE.streams)
    for stream in streams:
        sock = stream.get_extra_info("socket")
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed meanwhile
            pass


@contextmanager
def deadline(what: str) -> Iterator[None]:
    """The Hub requests within end within ``RELEASE_HUB_DEADLINE`` seconds, all together; ``what`` (``the plan of
    ORG/REPO``) names them in the error. Within another deadline, that one holds. A failure once it has passed is
    a ``HubRefusal`` saying so."""
    if _SCOPE.get() is not None:
        yield
        return
    seconds = _seconds(DEADLINE_ENV)
    scope = _Scope(what, seconds, time.monotonic() + seconds)
    timer = threading.Timer(seconds, _cut, (scope,))
    timer.daemon = True
    reset = _SCOPE.set(scope)
    timer.start()
    try:
        yield
    except Exception as exc:
        if time.monotonic() < scope.until or isinstance(exc, (HubRefusal, ReleaseError)):
            raise
        raise HubRefusal(_expired(scope)) from exc
    finally:
        with _STATE.lock:
            scope.done = True
        timer.cancel()
        _SCOPE.reset(reset)


def describe(exc: BaseException) -> str:
    """What went wrong with a Hub request, in one line: a passed deadline, a timeout (which, after how long), a
    refusal of this client, else the exception's type and first line."""
    scope = _SCOPE.get()
    if scope is not None and time.monotonic() >= scope.until:
        return _expired(scope)
    seen: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in seen:  # huggingface_hub wraps some (a download's LocalEntryNotFound)
        seen.append(cause)
        if isinstance(cause, HubRefusal):
            return str(cause)
        if isinstance(cause, httpx2.TimeoutException):
            kind = type(cause).__name__.removesuffix("Timeout").lower()
            try:
                request = cause.request
            except RuntimeError:  # no request recorded
                return f"{type(cause).__name__}: a Hub request timed out (raise {TIMEOUT_ENV} for a slow network)"
            after = (request.extensions.get("timeout") or {}).get(kind)
            return (f"{_call(request)}: timed out ({kind}, after {after:g} s; raise {TIMEOUT_ENV} for a slow "
                    "network)" if after is not None else f"{_call(request)}: timed out ({kind})")
        cause = cause.__cause__ or cause.__context__
    first = next(iter(str(exc).splitlines()), "")
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
