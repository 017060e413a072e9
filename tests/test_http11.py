"""The client's HTTP/1.1 connections, against a real HTTP server on a socket (the standard library's,
whose handler records what reached it)."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from hai_airflow.client import HaiClient, HaiError, HaiUnreachable
from hai_airflow.http11 import Http, TransportError, query
from tests.support.live_server import free_port


@dataclass
class Seen:
    requests: list[dict[str, Any]] = field(default_factory=list)
    peers: set[int] = field(default_factory=set)
    """The client ports requests came from: one per connection."""
    release: threading.Event = field(default_factory=threading.Event)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Seen

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.peers.add(self.client_address[1])
        self.seen.requests.append(
            {"method": self.command, "path": self.path, "body": body.decode(), "headers": dict(self.headers)}
        )
        if self.path.startswith("/stream"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in ("first ", "sec\u00f6nd"):
                data = part.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                self.seen.release.wait(10)  # the client shows it read the first part before the second
            self.wfile.write(b"0\r\n\r\n")
            return
        status = 404 if self.path.startswith("/missing") else 200
        out = json.dumps({"path": self.path, "n": len(self.seen.requests)}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        if self.path.startswith("/close"):
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = _answer


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """A server on a local port answering with `handler`, in a thread of its own while in use."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def server() -> Iterator[tuple[str, Seen, ThreadingHTTPServer]]:
    seen = Seen()
    with serving(type("Recording", (Handler,), {"seen": seen})) as httpd:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, httpd


def test_a_request_carries_its_headers_body_and_query_and_comes_back_parsed(server: Any) -> None:
    url, seen, _ = server
    http = Http(url + "/prefix/", {"Authorization": "Bearer t"}, timeout=5)
    reply = http.request("POST", "/api/x", params={"all": True, "tail": 0, "q": "a b"}, json={"k": [1]})
    assert reply.status_code == 200
    assert reply.json()["path"] == "/prefix/api/x?all=true&tail=0&q=a+b"
    got = seen.requests[0]
    assert got["body"] == '{"k":[1]}'
    assert got["headers"]["Authorization"] == "Bearer t"
    assert got["headers"]["Content-Type"] == "application/json"
    assert query({"all": False, "none": None}) == "?all=false&none="
    assert query({}) == ""


def test_requests_one_after_another_share_one_connection(server: Any) -> None:
    url, seen, _ = server
    http = Http(url, {}, timeout=5)
    for _ in range(5):
        assert http.request("GET", "/ok").status_code == 200
    assert len(seen.peers) == 1


def test_a_connection_the_server_closed_is_not_reused_and_the_request_runs_once(server: Any) -> None:
    url, seen, _ = server
    http = Http(url, {}, timeout=5)
    assert http.request("GET", "/close").status_code == 200  # the server ends this connection
    assert http.request("POST", "/after", json={}).json()["n"] == 2
    assert [r["path"] for r in seen.requests] == ["/close", "/after"]
    assert len(seen.peers) == 2


def test_a_kept_connection_dropped_while_idle_is_replaced(server: Any) -> None:
    """The server closes a kept-alive connection between two requests (as uvicorn does after 5 s idle)."""
    url, seen, _ = server
    http = Http(url, {}, timeout=5)
    http.request("GET", "/one")
    (conn,) = http._idle
    assert conn.sock is not None
    conn.sock.shutdown(0)  # stands for the server's FIN arriving: the socket reads as closed
    assert http.request("POST", "/two", json={}).status_code == 200
    assert [r["path"] for r in seen.requests] == ["/one", "/two"]


def test_a_stream_yields_what_has_come_before_the_rest_is_sent(server: Any) -> None:
    url, seen, _ = server
    http = Http(url, {}, timeout=5)
    with http.stream("GET", "/stream") as resp:
        assert resp.status_code == 200
        pieces = resp.iter_text()
        assert next(pieces) == "first "
        seen.release.set()
        assert "".join(pieces) == "sec\u00f6nd"
    assert http.request("GET", "/ok").status_code == 200
    assert len(seen.peers) == 1, "a stream read to its end leaves its connection for the next request"


def test_threads_sharing_a_client_each_get_their_own_answer(server: Any) -> None:
    url, _, _ = server
    http = Http(url, {}, timeout=5)
    with ThreadPoolExecutor(8) as pool:
        paths = list(pool.map(lambda i: http.request("GET", f"/n{i}").json()["path"], range(80)))
    assert paths == [f"/n{i}" for i in range(80)]
    assert len(http._idle) <= 8


def test_no_server_is_a_transport_error_and_the_client_says_unreachable(server: Any) -> None:
    url, _, httpd = server
    httpd.shutdown()
    httpd.server_close()
    with pytest.raises(TransportError) as caught:
        Http(url, {}, timeout=5).request("GET", "/x")
    assert caught.value.kind == "ConnectionRefusedError"
    with pytest.raises(HaiUnreachable, match=r"cannot reach the hai server at http://127\.0\.0\.1:\d+"):
        HaiClient(server=url, token="t").whoami()


def test_a_refusal_is_a_hai_error_with_the_status(server: Any) -> None:
    url, _, _ = server
    with pytest.raises(HaiError) as caught:
        HaiClient(server=url + "/missing", token="t").whoami()
    assert caught.value.status == 404


@pytest.mark.parametrize("bad", ["127.0.0.1:8765", "ftp://host", "http://host:port", "http://"])
def test_a_server_url_that_is_not_usable_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(HaiError) as caught:
        HaiClient(server=bad, token="t")
    assert caught.value.status == 2 and caught.value.field == "server"
    assert "http://127.0.0.1:8765" in caught.value.message


PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "request_method")


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy variable but those a test sets."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_http_proxy_from_the_environment_gets_the_whole_url_unless_no_proxy_names_the_host(
    server: Any, environment: pytest.MonkeyPatch
) -> None:
    url, seen, _ = server
    target = f"http://127.0.0.1:{free_port()}/api"  # nothing listens: only the proxy can answer
    environment.setenv("http_proxy", url.replace("http://", "http://ann:p%40ss@"))
    reply = Http(target, {"Authorization": "Bearer t"}, timeout=5).request("GET", "/jobs", params={"a": 1})
    assert reply.json()["path"] == f"{target}/jobs?a=1"
    headers = seen.requests[-1]["headers"]
    assert headers["Proxy-Authorization"] == "Basic " + base64.b64encode(b"ann:p@ss").decode()
    assert headers["Authorization"] == "Bearer t"
    environment.setenv("no_proxy", "localhost,127.0.0.1")
    with pytest.raises(TransportError) as caught:
        Http(target, {}, timeout=5).request("GET", "/jobs")
    assert caught.value.kind == "ConnectionRefusedError"  # went straight to the server
    assert len(seen.requests) == 1


class Tunnels(BaseHTTPRequestHandler):
    """A proxy that records each CONNECT and refuses it (what passes through a tunnel is TLS)."""

    protocol_version = "HTTP/1.1"
    asked: ClassVar[list[tuple[str, str | None]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_CONNECT(self) -> None:
        self.asked.append((self.path, self.headers.get("Proxy-Authorization")))
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_https_goes_through_a_connect_tunnel_so_the_proxy_never_sees_the_request(
    environment: pytest.MonkeyPatch,
) -> None:
    Tunnels.asked.clear()
    with serving(Tunnels) as httpd:
        environment.setenv("HTTPS_PROXY", f"ann:pw@127.0.0.1:{httpd.server_address[1]}")
        with pytest.raises(TransportError):
            Http("https://hai.example:8443", {"Authorization": "Bearer t"}, timeout=5).request("GET", "/x")
    assert Tunnels.asked == [("hai.example:8443", "Basic " + base64.b64encode(b"ann:pw").decode())]


@pytest.mark.parametrize("proxy", ["socks5://127.0.0.1:1080", "http://proxy:port"])
def test_a_proxy_that_cannot_be_used_is_refused_naming_the_variable(
    environment: pytest.MonkeyPatch, proxy: str
) -> None:
    environment.setenv("HTTP_PROXY", proxy)
    with pytest.raises(HaiError) as caught:
        HaiClient(server="http://127.0.0.1:8765", token="t")
    assert caught.value.status == 2 and caught.value.field == "http_proxy"
    environment.setenv("NO_PROXY", "127.0.0.1")
    HaiClient(server="http://127.0.0.1:8765", token="t").close()  # not used for this server: no matter
