"""Blocking HTTP/1.1 for `HaiClient`: kept-alive connections of the standard library's `http.client`.

A request through httpx cost about four times the CPU of the same request through `http.client`
(a `whoami` GET: 0.69 against 0.18 ms; a submit: 1.7 against 0.44 ms), so sixteen threads submitting
through httpx spent more CPU than the server they submitted to. The async client, whose requests are
few and mostly long polls, stays on httpx.

A proxy comes from the environment as for curl, httpx and the async client: `https_proxy` or
`http_proxy` (either case), unless `no_proxy` names the server's host. A request to an `http://`
server goes to the proxy with the whole URL as its target; one to an `https://` server goes through a
`CONNECT` tunnel, so the proxy never sees the token.
"""

from __future__ import annotations

import base64
import codecs
import http.client
import json as jsonlib
import select
import ssl
import threading
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlencode, urlsplit


class TransportError(Exception):
    """No answer came: the connection was refused, reset or timed out (`kind` names which)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


@dataclass(frozen=True)
class Reply:
    """A response read whole."""

    status_code: int
    reason_phrase: str
    content: bytes
    content_type: str = ""
    retry_after: float | None = None
    """The server's `Retry-After` (seconds), if it sent one."""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class Stream:
    """A response read as it comes (`iter_text`), or whole (`read`)."""

    def __init__(self, response: http.client.HTTPResponse):
        self._response = response
        self.status_code = response.status
        self.content_type = response.getheader("Content-Type", "")

    def read(self) -> Reply:
        """The rest of the response, read whole."""
        after = self._response.getheader("Retry-After")
        retry_after = float(after) if after is not None and after.strip().isdigit() else None
        body = self._response.read()
        return Reply(self.status_code, self._response.reason, body, self.content_type, retry_after)

    @property
    def length(self) -> int | None:
        """The Content-Length the server announced, if any."""
        value = self._response.getheader("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def iter_bytes(self) -> Iterator[bytes]:
        while chunk := self._response.read1(65536):
            yield chunk

    def iter_lines(self) -> Iterator[bytes]:
        """Whole lines (without their newline) as they come; an unfinished last line at the end."""
        pending = b""
        for chunk in self.iter_bytes():
            *lines, pending = (pending + chunk).split(b"\n")
            yield from lines
        if pending:
            yield pending

    def iter_text(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for chunk in self.iter_bytes():
            if text := decoder.decode(chunk):
                yield text
        if tail := decoder.decode(b"", final=True):
            yield tail


def query(params: Mapping[str, Any] | None) -> str:
    """`?a=1&b=true` for the params (booleans as `true`/`false`, None as empty), or nothing."""
    if not params:
        return ""

    def text(value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return "?" + urlencode([(key, text(value)) for key, value in params.items()])


def server_url(base_url: str) -> SplitResult:
    """The parts of a server's URL; ValueError unless it is ``http(s)://host[:port][/prefix]``."""
    url = urlsplit(base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    url.port  # noqa: B018 (raises ValueError for a port that is not a number)
    return url


def proxy_for(url: SplitResult) -> SplitResult | None:
    """The proxy the environment names for the server at `url`, or None (none named, or `no_proxy`
    covers its host); ValueError, naming the variable, for one that is not ``http://[user:pass@]host:port``."""
    proxy = urllib.request.getproxies().get(url.scheme)
    host = url.hostname or ""
    if not proxy or urllib.request.proxy_bypass(f"{host}:{url.port}" if url.port else host):
        return None
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url.scheme}_proxy {proxy!r} is not an http://host:port proxy")
    try:
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError:
        raise ValueError(f"{url.scheme}_proxy {proxy!r} has a port that is not a number") from None
    return parts


def _proxy_authorization(proxy: SplitResult) -> dict[str, str]:
    """The `Proxy-Authorization` header for the proxy URL's user and password, if it names any."""
    if proxy.username is None:
        return {}
    pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
    return {"Proxy-Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


class Http:
    """Requests to one server over kept-alive connections: one per request in flight, so threads may
    share it. A connection the server closed while idle is not used again. A request is never sent
    twice: one whose connection fails is a `TransportError`, as it may have reached the server.

    :param base_url: ``http://host:port`` or ``https://...``, with an optional path prefix.
    :param headers: sent with every request.
    :param timeout: seconds to connect, and to wait for each read, unless a request says otherwise.
    """

    def __init__(self, base_url: str, headers: Mapping[str, str], timeout: float | None):
        url = server_url(base_url)
        self._https = url.scheme == "https"
        self._host = url.hostname or ""
        self._port = url.port
        self._prefix = url.path.rstrip("/")
        self._headers = dict(headers)
        self._timeout = timeout
        self._proxy = proxy_for(url)
        self._origin = ""
        """What comes before the path in a request's target: the server itself, through a proxy."""
        if self._proxy is not None and not self._https:
            self._origin = f"http://{url.netloc.rpartition('@')[2]}"
            self._headers |= _proxy_authorization(self._proxy)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        timeout: float | None = None,
    ) -> Reply:
        """Send the request and read its response whole, waiting `timeout` seconds for each read (the
        client's own when None); `TransportError` when no answer came."""
        wait = self._timeout if timeout is None else timeout
        with self._exchange(method, path, params, json, wait) as response:
            return Stream(response).read()

    @contextmanager
    def stream(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, json: Any = None
    ) -> Iterator[Stream]:
        """The response as it comes, for as long as it takes; its connection is kept only if it was
        read to the end."""
        with self._exchange(method, path, params, json, None) as response:
            yield Stream(response)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    @contextmanager
    def _exchange(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        wait: float | None,
    ) -> Iterator[http.client.HTTPResponse]:
        """The response to the request; what fails on the way, reading included, is a `TransportError`."""
        headers = dict(self._headers)
        body = None
        if json is not None:
            body = jsonlib.dumps(json, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        target = self._origin + self._prefix + path + query(params)
        conn = self._take()
        try:
            response = self._send(conn, method, target, body, headers, wait)
            yield response
        except (http.client.HTTPException, OSError) as e:
            conn.close()
            raise TransportError(type(e).__name__) from None
        except BaseException:
            conn.close()
            raise
        if response.isclosed() and not response.will_close:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()

    @staticmethod
    def _send(
        conn: http.client.HTTPConnection,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        wait: float | None,
    ) -> http.client.HTTPResponse:
        """Send on `conn` (connecting within the client's timeout) and read the response's head,
        waiting `wait` seconds for each read (None: for ever)."""
        if conn.sock is None:
            conn.connect()
        conn.sock.settimeout(wait)
        conn.request(method, target, body=body, headers=headers)
        return conn.getresponse()

    def _take(self) -> http.client.HTTPConnection:
        """An idle connection still open, else a new one."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn = self._idle.pop()
            sock = conn.sock
            # Readable while idle means the server closed it (or broke the protocol): not reusable.
            if sock is not None and not select.select([sock], [], [], 0)[0]:
                return conn
            conn.close()
        return self._connect()

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self._host, self._port
        if self._proxy is not None:
            host, port = self._proxy.hostname or "", self._proxy.port or 80
        if not self._https:
            return http.client.HTTPConnection(host, port, timeout=self._timeout)
        context = ssl.create_default_context()
        conn = http.client.HTTPSConnection(host, port, timeout=self._timeout, context=context)
        if self._proxy is not None:
            conn.set_tunnel(self._host, self._port or 443, headers=_proxy_authorization(self._proxy))
        return conn
