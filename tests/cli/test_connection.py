"""Where the server is wrong: one that never answered, one that went away mid-follow, one that is not hai."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hai_airflow.cli.connection import RECONNECT_FOR_SECONDS
from tests.cli.conftest import Hai, free_port
from tests.cli.test_usage import assert_one_error_line

Handler = type[http.server.BaseHTTPRequestHandler]


@functools.cache
def answering(status: int, content_type: str, body: str) -> Handler:
    """A handler that gives every GET the same answer."""

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Answer


def serving_a_directory(root: Path) -> Handler:
    """Python's `http.server`: the directory's files, and its own HTML 404 page for anything else."""
    (root / "index.html").write_text("<html><body><h1>notes</h1></body></html>\n", encoding="utf-8")

    class Files(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, directory=str(root), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    return Files


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Handler], str]]:
    """Start an HTTP server on a free loopback port with the handler; returns its URL."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(handler: Handler) -> str:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        servers.append(server)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# ---- a server that never answered ----------------------------------------------------------


def test_log_follow_to_a_server_that_never_answered_fails_at_once(hai: Hai) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = hai("log", "--instance-id=1", "--follow", "--server", url)
    took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert_one_error_line(result.stderr, f"cannot reach the hai server at {url}", "hai serve", "--server")
    assert result.stdout == ""
    # Reconnecting is for a server that went away, not one that was never there.
    assert took < 5 < RECONNECT_FOR_SECONDS, f"took {took:.1f} s"


# ---- a follow that was connected and lost the server ---------------------------------------


class LosesTheServer(http.server.BaseHTTPRequestHandler):
    """hai's log routes, for instance 1, whose whole log is `WHOLE`: the first follow sends `FIRST`
    and breaks off mid-answer, as a server that stops does; the rest answer in full."""

    protocol_version = "HTTP/1.1"
    WHOLE = "tick 0\ntick 1\ntick 2\n"
    FIRST = ""
    follows = 0

    def do_GET(self) -> None:
        following = "follow=true" in self.path
        cls = type(self)
        first = following and cls.follows == 0
        cls.follows += following
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        text = cls.FIRST if first else cls.WHOLE
        if text:
            self.wfile.write(f"{len(text.encode()):x}\r\n{text}\r\n".encode())
        if first:
            # No last chunk: the client sees the connection break, not the log end.
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    "printed_first",
    [
        pytest.param("tick 0\n", id="after some output"),
        pytest.param("", id="before any output"),
    ],
)
def test_log_follow_that_was_connected_reconnects_without_repeating_lines(
    hai: Hai, serve: Callable[[Handler], str], printed_first: str
) -> None:
    handler = type("Lost", (LosesTheServer,), {"FIRST": printed_first, "follows": 0})
    url = serve(handler)
    result = hai("log", "--instance-id=1", "--follow", "--server", url)
    assert result.exit_code == 0, result.output
    assert result.stdout == LosesTheServer.WHOLE
    assert handler.follows == 2


# ---- a server that is not hai --------------------------------------------------------------

NOT_FOUND_PAGE = (
    "<!DOCTYPE html>\n<html>\n<head><title>404 Not Found</title></head>\n"
    "<body>\n<h1>Not Found</h1>\n</body>\n</html>\n"
)
LOGIN_PAGE = "<!DOCTYPE html>\n<html>\n<body>\n<form>Sign in</form>\n</body>\n</html>\n"
BAD_REQUEST_PAGE = "<html><body><h1>400 Bad Request</h1></body></html>\n"
PROBLEM = '{"detail": "Not Found", "status": 404, "title": "Not Found", "type": "about:blank"}'

NOT_HAI = [
    pytest.param(serving_a_directory, id="python http.server on a directory"),
    pytest.param(lambda _root: answering(404, "text/html", NOT_FOUND_PAGE), id="an HTML 404 page"),
    pytest.param(lambda _root: answering(200, "text/html", LOGIN_PAGE), id="an HTML page for every path"),
    pytest.param(lambda _root: answering(404, "application/json", PROBLEM), id="JSON that is not hai's"),
    pytest.param(lambda _root: answering(400, "text/html", BAD_REQUEST_PAGE), id="an HTML 400 page"),
]

COMMANDS = [
    pytest.param(("task",), id="task"),
    pytest.param(("res",), id="res"),
    pytest.param(("instance", "--task-id=1"), id="instance"),
    pytest.param(("log", "--instance-id=1"), id="log"),
    pytest.param(("log", "--instance-id=1", "--follow"), id="log follow"),
    pytest.param(("cancel", "--task-id=1", "--yes"), id="cancel"),
]


@pytest.mark.parametrize("args", COMMANDS)
@pytest.mark.parametrize("handler_for", NOT_HAI)
def test_a_server_that_is_not_hai_is_named_on_one_line(
    hai: Hai,
    serve: Callable[[Handler], str],
    tmp_path: Path,
    handler_for: Callable[[Path], Handler],
    args: tuple[str, ...],
) -> None:
    url = serve(handler_for(tmp_path))
    result = hai(*args, "--server", url)
    assert result.exit_code == 1, result.output
    assert_one_error_line(result.stderr, f"{url} is not a hai server", "--server", "HAI_SERVER")
    assert "<" not in result.stderr and "Not Found" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("args", [pytest.param(("task",), id="task"), pytest.param(("quota",), id="quota")])
def test_plain_text_where_hai_answers_json_is_not_hai(
    hai: Hai, serve: Callable[[Handler], str], args: tuple[str, ...]
) -> None:
    # Only where hai answers JSON: a log is plain text, so "OK" could be one.
    url = serve(answering(200, "text/plain", "OK\n"))
    result = hai(*args, "--server", url)
    assert result.exit_code == 1, result.output
    assert_one_error_line(result.stderr, f"{url} is not a hai server", "HTTP 200 text/plain")
    assert result.stdout == ""


def test_hai_server_variable_that_is_not_hai_is_named(hai: Hai, serve: Callable[[Handler], str]) -> None:
    url = serve(answering(404, "text/html", NOT_FOUND_PAGE))
    result = hai("queue", env={"HAI_SERVER": url})
    assert result.exit_code == 1, result.output
    assert_one_error_line(result.stderr, f"{url} is not a hai server", "HAI_SERVER")


@pytest.mark.parametrize(
    ("status", "code"),
    [pytest.param(404, 1, id="not found exits 1"), pytest.param(422, 2, id="bad input exits 2")],
)
def test_hai_refusals_are_unchanged(
    hai: Hai, serve: Callable[[Handler], str], status: int, code: int
) -> None:
    refusal = '{"error": "task 7 does not exist", "field": null, "fix": "See `hai task` for your tasks"}'
    url = serve(answering(status, "application/json", refusal))
    result = hai("task", "--task-id=7", "--server", url)
    assert result.exit_code == code, result.output
    assert result.stderr == "Error: task 7 does not exist. See `hai task` for your tasks.\n"
