"""Faults of the Hub client (issue 52): servers that misbehave as real networks and proxies do, on loopback; each
ends within its bound in one line (exit 2), nothing half-published, and the test's token appears nowhere.

Every test sets small bounds through the environment (``RELEASE_HUB_TIMEOUT``, ``RELEASE_HUB_DEADLINE``) and checks
its own wall time."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import tests.hub_server as hub_server
from release.core.io import cache_dir
from release.core.redact import scrub
from release.publish.hub_client import MAX_ANSWER
from tests.conftest import invoke
from tests.hub_server import FakeHub
from tests.test_push import RTN

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub
TOKEN = "hf_" + "Kq7Zr" * 6 + "WxYz"  # the shape of a real token: the scrubber's pattern would catch it too
REPO = f"np-cr/{RTN}"


@pytest.fixture
def known(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """The Hub double, expecting this file's token, with it in ``HF_TOKEN``; tight bounds."""
    hub.expected_token = TOKEN
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("RELEASE_HUB_TIMEOUT", "1")
    monkeypatch.setenv("RELEASE_HUB_DEADLINE", "10")
    return hub


class Listener:
    """A loopback HTTP listener that answers each request with ``answer(listener, connection, request head)``."""

    def __init__(self, answer: Callable[[Listener, socket.socket, str], None]) -> None:
        self.answer = answer
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.stopped = threading.Event()
        self.connections: list[socket.socket] = []
        self.requests: list[str] = []
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n")[0].decode("latin-1")
            self.requests.append(head.split("\r\n")[0])
            self.answer(self, conn, head)
        except OSError:  # the client gave up
            pass
        finally:
            conn.close()

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self) -> None:
        self.stopped.set()
        for sock in (self.socket, *self.connections):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.socket.close()


@pytest.fixture
def listen() -> Iterator[Callable[[Callable[[Listener, socket.socket, str], None]], Listener]]:
    made: list[Listener] = []

    def start(answer: Callable[[Listener, socket.socket, str], None]) -> Listener:
        made.append(Listener(answer))
        return made[-1]

    yield start
    for listener in made:
        listener.close()


def never(listener: Listener, conn: socket.socket, head: str) -> None:
    """Accepts, reads the request, never answers."""
    listener.stopped.wait()


def drip(listener: Listener, conn: socket.socket, head: str) -> None:
    """A whole answer, status line first, one byte a second."""
    for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}":
        if listener.stopped.wait(1.0):
            return
        listener.send(conn, bytes([byte]))


def oversized(chunked: bool) -> Callable[[Listener, socket.socket, str], None]:
    """A 150 MB answer, with its length or (``chunked``) without one."""
    size, piece = 150 * 2**20, b" " * 2**20

    def answer(listener: Listener, conn: socket.socket, head: str) -> None:
        length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
        listener.send(conn, f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}\r\n\r\n".encode())
        for _ in range(size // len(piece)):
            listener.send(conn, b"100000\r\n" + piece + b"\r\n" if chunked else piece)
        listener.send(conn, b"0\r\n\r\n" if chunked else b"")

    return answer


def redirect_to(url: str) -> Callable[[Listener, socket.socket, str], None]:
    """Every request redirected (307: the method and body kept) to the same path on ``url``."""

    def answer(listener: Listener, conn: socket.socket, head: str) -> None:
        path = head.split(" ")[1]
        listener.send(conn, f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {url}{path}\r\nContent-Length: 0\r\n"
                            "Connection: close\r\n\r\n".encode())

    return answer


def push(endpoint: str, dist: Path, *args: str) -> tuple[Result, float]:
    start = time.monotonic()
    result = invoke("-q", "push", "rtn", "--dist", dist, "--endpoint", endpoint, *args)
    return result, time.monotonic() - start


def one_line(result: Result, *parts: str) -> str:
    """The failed command's only output: one error line, exit 2, every one of ``parts`` in it."""
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    for part in parts:
        assert part in result.output, result.output
    return result.output


def token_nowhere(result: Result, *folders: Path) -> None:
    """The token, or any piece of it, in neither stdout nor stderr nor any file the push wrote."""
    pieces = {TOKEN, TOKEN[:20], TOKEN[20:]}
    for text in (result.stdout, result.stderr, result.output):
        assert not any(p in text for p in pieces), text
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    for path in [*files, cache_dir() / "hashes.json"]:
        data = path.read_bytes() if path.is_file() else b""
        assert not any(p.encode() in data for p in pieces), path


# ---------------------------------------------------------------- 1. timeouts and deadlines


@pytest.mark.parametrize("timeout, deadline, message", [
    ("1", "30", "timed out (read, after 1 s; raise RELEASE_HUB_TIMEOUT"),
    ("30", "1.5", f"the plan of {REPO} took over 1.5 s (RELEASE_HUB_DEADLINE raises it), at GET "),
])
def test_a_listener_that_never_answers_ends_the_dry_run_within_its_bound(
        timeout: str, deadline: str, message: str, known: FakeHub, dist: Path, tmp_path: Path, listen: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEASE_HUB_TIMEOUT", timeout)
    monkeypatch.setenv("RELEASE_HUB_DEADLINE", deadline)
    server = listen(never)
    result, took = push(server.url, dist, "--dry-run")
    one_line(result, f"cannot read {REPO} from {server.url}: ", message, f"{server.url}/api/models/{REPO}")
    assert took < min(float(timeout), float(deadline)) + 3, took
    token_nowhere(result, tmp_path)


@pytest.mark.parametrize("args", [("--dry-run",), ()])
def test_a_slow_writer_is_cut_at_the_plans_deadline(args: tuple[str, ...], known: FakeHub, dist: Path,
                                                    tmp_path: Path, listen: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One byte a second never trips a read timeout of 5 s: the plan's deadline (2 s) ends it, the status line
    still unread."""
    monkeypatch.setenv("RELEASE_HUB_TIMEOUT", "5")
    monkeypatch.setenv("RELEASE_HUB_DEADLINE", "2")
    server = listen(drip)
    result, took = push(server.url, dist, *args)
    one_line(result, f"the plan of {REPO} took over 2 s (RELEASE_HUB_DEADLINE raises it), at GET {server.url}")
    assert took < 5, took
    assert server.sent < 10  # cut in the status line
    token_nowhere(result, tmp_path)


def test_a_commit_answer_past_the_timeout_is_one_line_and_the_rerun_tags_it(known: FakeHub, dist: Path,
                                                                           tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub applies the commit and answers after the read timeout: one line that says it may be applied; the
    rerun commits nothing and tags it."""
    commit = hub_server._Handler._commit

    def late(self: Any, repo: Any, revision: str) -> None:
        answer = self._json
        self._json = lambda *a, **k: (time.sleep(2), answer(*a, **k))
        try:
            commit(self, repo, revision)
        finally:
            del self._json  # the handler serves the connection's next requests

    monkeypatch.setattr(hub_server._Handler, "_commit", late)
    result, took = push(known.url, dist)
    one_line(result, f"{REPO}: the connection dropped during the commit (POST {known.url}/api/models/{REPO}/commit"
                     "/main: timed out (read, after 1 s", "may have applied it")
    assert took < 8, took
    assert len(known.commits(REPO)) == 2 and known.tags(REPO) == {}  # committed, not tagged
    monkeypatch.setattr(hub_server._Handler, "_commit", commit)
    time.sleep(1.5)  # the late answer's handler lets the double go
    again, _ = push(known.url, dist)
    assert again.exit_code == 0 and "no changes, nothing uploaded; tagged v1.0.0" in again.output, again.output
    token_nowhere(result, tmp_path)
    token_nowhere(again, tmp_path)


# ---------------------------------------------------------------- 2. answers bounded in size


@pytest.mark.parametrize("chunked, message", [
    (False, "an answer of 157,286,400 bytes (Content-Length), over the 67,108,864 a Hub answer may have; refused "
            "unread"),
    (True, "an answer over 67,108,864 bytes, more than a Hub answer may have; refused at that size"),
])
def test_an_oversized_answer_is_refused_without_reading_it(chunked: bool, message: str, known: FakeHub, dist: Path,
                                                           tmp_path: Path, listen: Any) -> None:
    server = listen(oversized(chunked))
    result, took = push(server.url, dist, "--dry-run")
    one_line(result, f"cannot read {REPO} from {server.url}: GET {server.url}/api/models/{REPO}: {message}")
    assert took < 10, took
    # what the server got out before the client shut the connection: socket buffers, and at most the bound
    assert server.sent < (MAX_ANSWER + 16 * 2**20 if chunked else 16 * 2**20), server.sent
    token_nowhere(result, tmp_path)


# ---------------------------------------------------------------- 3. the token


@pytest.mark.parametrize("value", [TOKEN + "\r", TOKEN[:20] + "\n" + TOKEN[20:], TOKEN + " ", TOKEN + "\x1b"])
def test_a_token_with_whitespace_or_control_characters_is_refused_before_any_request(
        value: str, known: FakeHub, dist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", value)
    result, _ = push(known.url, dist, "--dry-run")
    one_line(result, "error: HF_TOKEN holds whitespace, a control character", "nothing was sent")
    assert known.requests == []
    token_nowhere(result, tmp_path)


def test_a_message_quoting_the_request_headers_is_scrubbed(known: FakeHub, dist: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx's refusal of a header quotes it whole (what a CRLF token printed before issue 52): the CLI's line is
    scrubbed of the token and of any authorization value."""
    import httpx2
    from huggingface_hub import HfApi

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise httpx2.LocalProtocolError(f"Illegal header value b'Bearer {TOKEN[:20]}\\n{TOKEN[20:]}'")

    monkeypatch.setattr(HfApi, "repo_info", refused)
    result, _ = push(known.url, dist, "--dry-run")
    one_line(result, "LocalProtocolError: Illegal header value b'Bearer <redacted>'")
    token_nowhere(result, tmp_path)


@pytest.mark.parametrize("text, scrubbed", [
    (f"Illegal header value b'Bearer {TOKEN}\\r'", "Illegal header value b'Bearer <redacted>'"),
    ("{'authorization': 'Bearer abc.def-ghi'}", "{'authorization': 'Bearer <redacted>'}"),
    ("Authorization: Basic dXNlcjpwYXNz, then", "Authorization: <redacted> dXNlcjpwYXNz, then"),
    (f"token {'hf_' + 'a' * 34} seen", "token <redacted> seen"),
    ("hf_home/cache and a plain message", "hf_home/cache and a plain message"),
])
def test_the_scrubber(text: str, scrubbed: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert scrub(text) == scrubbed


# ---------------------------------------------------------------- 4. redirects and answers that are not the Hub's


def test_a_redirect_of_every_request_to_another_host_is_refused_before_any_write(known: FakeHub, dist: Path,
                                                                                tmp_path: Path, listen: Any) -> None:
    """A 307 to another loopback port (the double of the Hub there): refused at the plan's first request, so the
    other host gets nothing, no repo is made there, and no internal error follows."""
    server = listen(redirect_to(known.url))
    result, took = push(server.url, dist)
    one_line(result, f"GET {server.url}/api/models/{REPO}: redirected to another host ({known.url}); refused before "
                     "anything was sent there")
    assert took < 5, took
    assert known.requests == [] and known.repos == {}
    token_nowhere(result, tmp_path)


def test_a_commit_answer_that_is_not_json_is_one_line_and_the_rerun_tags_it(known: FakeHub, dist: Path,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy's HTML page in place of the commit's JSON answer (the commit applied): one line, never an internal
    error; the rerun commits nothing and tags it."""
    commit = hub_server._Handler._commit

    def garbled(self: Any, repo: Any, revision: str) -> None:
        self._json = lambda *a, **k: self._send(200, b"<html>bad gateway</html>", {"Content-Type": "text/html"})
        try:
            commit(self, repo, revision)
        finally:
            del self._json  # the handler serves the connection's next requests

    monkeypatch.setattr(hub_server._Handler, "_commit", garbled)
    result, _ = push(known.url, dist)
    one_line(result, f"{REPO}: the answer to the commit is not one huggingface_hub reads (JSONDecodeError): the Hub "
                     "may have applied it; run 'release push' again")
    monkeypatch.setattr(hub_server._Handler, "_commit", commit)
    again, _ = push(known.url, dist)
    assert again.exit_code == 0 and "no changes, nothing uploaded; tagged v1.0.0" in again.output, again.output
    token_nowhere(result, tmp_path)
    token_nowhere(again, tmp_path)


def test_bounds_from_the_environment_are_checked(known: FakeHub, dist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("abc", "0", "-1", "inf", "nan"):
        monkeypatch.setenv("RELEASE_HUB_DEADLINE", value)
        result, _ = push(known.url, dist, "--dry-run")
        one_line(result, f"RELEASE_HUB_DEADLINE={value}: expected seconds, a positive number (default 300)")
    assert known.requests == []
