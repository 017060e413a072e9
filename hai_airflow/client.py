"""Sync and async clients over the REST API: the only way the CLI, Airflow and user code talk to hai."""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from hai_airflow import endpoints
from hai_airflow.backoff import Backoff
from hai_airflow.endpoints import BYTES, JSON, NDJSON, TEXT, Call
from hai_airflow.http11 import Http, Reply, Stream, TransportError, proxy_for, server_url
from hai_airflow.spec import ON_BEHALF_OF

if TYPE_CHECKING:
    import httpx

DEFAULT_SERVER = "http://127.0.0.1:8765"
RETRY_FOR_SECONDS = 120.0
"""How long a request is sent again while the server's database is unavailable (a restart, a cut)."""
RETRY_FIRST_DELAY = 2.0
RETRY_MAX_DELAY = 15.0
DEFAULT_REGION = "default"
TOKEN_FILE_VARIABLE = "HAI_TOKEN_FILE"
"""A file holding the API token: in a job, its credential (the platform sets it), else any such file."""

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound=Callable[..., Any])
log = logging.getLogger(__name__)


def hai_home() -> Path:
    """`$HAI_HOME`, default `~/.hai`."""
    return Path(os.environ.get("HAI_HOME") or Path.home() / ".hai")


class HaiError(Exception):
    """The server refused a request: HTTP status, what failed, the field and the fix."""

    def __init__(self, status: int, error: str, field: str | None = None, fix: str | None = None):
        self.status = status
        self.error = error
        self.field = field
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = self.error.rstrip(".") + "."
        if self.fix:
            text += " " + self.fix.rstrip(".") + "."
        return text


class HaiUnreachable(HaiError):
    """No hai server answered at the URL."""

    def __init__(self, url: str, detail: str = ""):
        super().__init__(
            0,
            f"cannot reach the hai server at {url}" + (f" ({detail})" if detail else ""),
            fix="Start one with `hai serve`, or point --server / HAI_SERVER / HAI_REGION at a running one",
        )
        self.url = url


class HaiConnectionLost(HaiUnreachable):
    """The server answered, then the connection broke before the answer ended: it stopped or restarted."""


class NotAHaiServer(HaiUnreachable):
    """Something answered at the URL, but not as hai answers: another web server, or a page in its place.
    `status` is that answer's HTTP status."""

    def __init__(self, url: str, status: int, answer: str):
        HaiError.__init__(
            self,
            status,
            f"{url} is not a hai server ({answer}, not an answer hai gives)",
            fix="Check --server / HAI_SERVER / HAI_REGION: point it at the URL `hai serve` listens on",
        )
        self.url = url


@dataclass(frozen=True)
class Connection:
    """Where the server is and who we are."""

    server: str
    token: str | None
    region: str = DEFAULT_REGION


def resolve_connection(
    server: str | None = None, token: str | None = None, region: str | None = None
) -> Connection:
    """Explicit values first, then HAI_SERVER / HAI_TOKEN / HAI_REGION, then `$HAI_HOME` files.

    `$HAI_HOME/client.toml` may hold `default_region = "..."` and a `[regions]` table of
    region name -> server URL; `$HAI_HOME/token` holds the token `hai serve` wrote. Without HAI_TOKEN,
    the file HAI_TOKEN_FILE names comes before `$HAI_HOME/token`: inside a job, the job's credential.
    """
    home = hai_home()
    cfg: dict[str, Any] = {}
    cfg_path = home / "client.toml"
    if cfg_path.exists():
        cfg = tomllib.loads(cfg_path.read_text(encoding="utf-8"))
    # An explicit region (a --region flag) outranks HAI_SERVER, as every flag outranks the environment.
    explicit_region = region
    region = region or os.environ.get("HAI_REGION") or cfg.get("default_region") or DEFAULT_REGION
    regions: dict[str, str] = cfg.get("regions", {})
    if server is None and explicit_region is None:
        server = os.environ.get("HAI_SERVER")
    if server is None:
        if region in regions:
            server = regions[region]
        elif region != DEFAULT_REGION and (explicit_region or os.environ.get("HAI_REGION")):
            raise _unknown_region(region, sorted(regions), cfg_path, explicit=explicit_region is not None)
        else:
            server = cfg.get("server") or DEFAULT_SERVER
    if token is None:
        token = os.environ.get("HAI_TOKEN")
    if token is None and os.environ.get(TOKEN_FILE_VARIABLE):
        token = _token_file(Path(os.environ[TOKEN_FILE_VARIABLE]))
    if token is None:
        token_path = home / "token"
        if token_path.exists():
            token = token_path.read_text(encoding="utf-8").strip() or None
    return Connection(server=server.rstrip("/"), token=token, region=region)


def _unknown_region(region: str, known: list[str], cfg_path: Path, explicit: bool) -> HaiError:
    """A region no [regions] entry names; `region` when the caller gave it (a flag, a connection's
    extra), `HAI_REGION` when the environment did."""
    listed = ", ".join(known) or "none configured"
    add = f"add it under [regions] in {cfg_path}"
    if explicit:
        fix = f"Give region {' or '.join(known)}, or {add}" if known else add[0].upper() + add[1:]
        return HaiError(2, f"unknown region {region!r} (known: {listed})", field="region", fix=fix)
    error = f"unknown region {region!r} in HAI_REGION (known: {listed})"
    return HaiError(2, error, field="HAI_REGION", fix=f"Unset HAI_REGION, or {add}")


def _token_file(path: Path) -> str:
    """The token in the file HAI_TOKEN_FILE names; a file that is missing, unreadable or empty is an
    error that names it (never skipped for another token: a job would act as someone else)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise HaiError(
            2,
            f"cannot read the token file {path} ({e.strerror or e})",
            field=TOKEN_FILE_VARIABLE,
            fix="Inside a job it is the job's credential, readable by the job's account while the job "
            f"runs; elsewhere point {TOKEN_FILE_VARIABLE} at a readable file or unset it",
        ) from None
    if not token:
        raise HaiError(
            2,
            f"the token file {path} is empty",
            field=TOKEN_FILE_VARIABLE,
            fix=f"Unset {TOKEN_FILE_VARIABLE}",
        )
    return token


def usable(connection: Connection) -> Connection:
    """The connection, if its server URL, and the proxy the environment names for it, can be used."""
    try:
        url = server_url(connection.server)
    except ValueError:
        raise HaiError(
            2,
            f"the server URL {connection.server!r} is not usable",
            field="server",
            fix="Give one like http://127.0.0.1:8765 (--server, HAI_SERVER or $HAI_HOME/client.toml)",
        ) from None
    try:
        proxy_for(url)
    except ValueError as e:
        raise HaiError(
            2,
            str(e),
            field=f"{url.scheme}_proxy",
            fix="Set it to http://host:port (with user:password@ if the proxy asks), or name the "
            "server's host in no_proxy",
        ) from None
    return connection


def _media_type(resp: httpx.Response | Reply | Stream) -> str:
    raw = resp.content_type if isinstance(resp, Reply | Stream) else resp.headers.get("content-type", "")
    return raw.partition(";")[0].strip().lower()


def _succeeded(resp: httpx.Response | Reply | Stream, expect: str) -> bool:
    """A success carrying what hai answers this request with."""
    return 200 <= resp.status_code < 300 and _media_type(resp) == expect


def _raise_for(resp: httpx.Response | Reply, server: str, request: str, expect: str = JSON) -> None:
    """Nothing for a success of the `expect`ed type; `HaiError` for a refusal in hai's JSON
    (`{"error", "field", "fix"}`); `NotAHaiServer` for any other answer (another server's HTML page,
    a login form, a redirect, someone else's JSON), which is never shown, so it cannot fill a screen."""
    if _succeeded(resp, expect):
        return
    status, media = resp.status_code, _media_type(resp)
    if status >= 400 and media == JSON:
        try:
            body = resp.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            raise HaiError(status, body["error"], body.get("field"), body.get("fix"))
    raise NotAHaiServer(server, status, f"{request} got HTTP {status} {media or 'with no content type'}")


def request_headers(token: str | None, on_behalf_of: str | None = None) -> dict[str, str]:
    """The headers every request carries: the token, and the user a service acts for."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if on_behalf_of is not None:
        headers[ON_BEHALF_OF] = on_behalf_of
    return headers


def _as_method(method: M, build: Callable[..., Call[Any]], owner: str) -> M:
    """`method` named and documented as the endpoint `build`: its docstring, and its signature with
    `self` first and what the call reads as the result."""
    method.__name__ = build.__name__
    method.__qualname__ = f"{owner}.{build.__name__}"
    method.__doc__ = build.__doc__
    signature = inspect.signature(build)
    result = signature.return_annotation  # `Call[JobView]` (a string, as annotations are) reads a JobView
    if isinstance(result, str) and result.startswith("Call["):
        result = result.removeprefix("Call[").removesuffix("]")
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    parameters = [this, *signature.parameters.values()]
    method.__signature__ = signature.replace(parameters=parameters, return_annotation=result)  # type: ignore[attr-defined]
    return method


def _blocking(build: Callable[P, Call[T]]) -> Callable[Concatenate[HaiClient, P], T]:
    """The `HaiClient` method that sends the endpoint's call and returns what its answer says."""

    def method(self: HaiClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(build(*args, **kwargs))

    return _as_method(method, build, "HaiClient")


def _awaited(build: Callable[P, Call[T]]) -> Callable[Concatenate[AsyncHaiClient, P], Coroutine[Any, Any, T]]:
    """The `AsyncHaiClient` method that sends the endpoint's call and returns what its answer says."""

    async def method(self: AsyncHaiClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._call(build(*args, **kwargs))

    return _as_method(method, build, "AsyncHaiClient")


class HaiClient:
    """Blocking client. Every method raises `HaiError` (or `HaiUnreachable`) on failure.

    :param server: base URL of `hai serve`; default from the environment / `$HAI_HOME`.
    :param token: API token; default from `HAI_TOKEN`, the file `HAI_TOKEN_FILE` names, or `$HAI_HOME/token`.
    :param region: region name looked up in `$HAI_HOME/client.toml`.
    :param timeout: seconds for ordinary requests (long-polls add their own wait).
    :param on_behalf_of: hai user to act for (sent as `X-Hai-On-Behalf-Of` on every request); the
        token must be a service identity whose `acts_for` covers that user. None acts as the token's user.
    :param retry_for: how long a request is sent again while the server's database is unavailable
        (503 with Retry-After); 0 never.
    :param on_wait: told of each such wait, in words (default: a logged warning).
    """

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        region: str | None = None,
        timeout: float = 30.0,
        on_behalf_of: str | None = None,
        retry_for: float = RETRY_FOR_SECONDS,
        on_wait: Callable[[str], object] | None = None,
    ):
        self.connection = usable(resolve_connection(server, token, region))
        self.on_behalf_of = on_behalf_of
        self.retry_for = retry_for
        self.on_wait = on_wait or log.warning
        headers = request_headers(self.connection.token, on_behalf_of)
        self._http = Http(self.connection.server, headers, timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HaiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, expect: str = JSON, **kw: Any) -> Reply:
        """One request, sent again while the server answers that its database is unavailable for now
        (503 with Retry-After), for up to `retry_for` seconds; `on_wait` is told of each wait."""
        backoff = Backoff(maximum=RETRY_MAX_DELAY, first=RETRY_FIRST_DELAY)
        deadline = time.monotonic() + self.retry_for
        while True:
            try:
                resp = self._http.request(method, path, **kw)
            except TransportError as e:
                raise HaiUnreachable(self.connection.server, e.kind) from None
            left = deadline - time.monotonic()
            if resp.status_code != 503 or resp.retry_after is None or left <= 0:
                break
            delay = min(max(resp.retry_after / 2, backoff.next_delay()), left)
            self.on_wait(
                f"the hai server's database is unavailable; retrying in {delay:.0f} s (for {left:.0f} s more)"
            )
            time.sleep(delay)
        _raise_for(resp, self.connection.server, f"{method} {path}", expect)
        return resp

    def _call(self, call: Call[T]) -> T:
        return call.answer(self._request(call.method, call.path, call.expect, **call.options()))

    # One method per endpoint: its parameters, defaults and documentation are `endpoints`'s.
    health = _blocking(endpoints.health)
    whoami = _blocking(endpoints.whoami)
    resource_packages = _blocking(endpoints.resource_packages)
    submit = _blocking(endpoints.submit)
    check_high_priority = _blocking(endpoints.check_high_priority)
    jobs = _blocking(endpoints.jobs)
    job = _blocking(endpoints.job)
    job_by_key = _blocking(endpoints.job_by_key)
    instances = _blocking(endpoints.instances)
    instance = _blocking(endpoints.instance)
    wait = _blocking(endpoints.wait)
    usage = _blocking(endpoints.usage)
    jobs_revision = _blocking(endpoints.jobs_revision)
    log = _blocking(endpoints.log)
    check_store = _blocking(endpoints.check_store)
    files = _blocking(endpoints.files)
    cancel = _blocking(endpoints.cancel)
    promote = _blocking(endpoints.promote)
    suspend = _blocking(endpoints.suspend)
    resume = _blocking(endpoints.resume)
    requeue = _blocking(endpoints.requeue)
    hold = _blocking(endpoints.hold)
    release = _blocking(endpoints.release)
    queue = _blocking(endpoints.queue)
    quota = _blocking(endpoints.quota)
    quotas = _blocking(endpoints.quotas)
    set_user_quota = _blocking(endpoints.set_user_quota)
    set_group_quota = _blocking(endpoints.set_group_quota)
    nodes = _blocking(endpoints.nodes)
    drain_node = _blocking(endpoints.drain_node)
    undrain_node = _blocking(endpoints.undrain_node)

    def follow_log(self, instance_id: int, tail: int = 0) -> Iterator[str]:
        """The log as it grows, until the instance ends; `HaiConnectionLost` if the server answered and
        then went away, `HaiUnreachable` if it never answered."""
        params = {"tail": tail, "follow": True}
        with self._streaming("GET", endpoints.log_path(instance_id), TEXT, params) as resp:
            yield from resp.iter_text()

    def download(self, job_id: int, path: str) -> Iterator[bytes]:
        """A file below the task's model dir, as it comes; `HaiConnectionLost` when it stopped short."""
        url = endpoints.file_content_path(job_id)
        got, size = 0, None
        with self._streaming("GET", url, BYTES, {"path": path}) as resp:
            size = resp.length
            for chunk in resp.iter_bytes():
                got += len(chunk)
                yield chunk
        if size is not None and got != size:
            raise HaiConnectionLost(self.connection.server, f"got {got} of {size} bytes")

    def exec(
        self, job_id: int, command: list[str], worker: int = 0, timeout: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Run `command` in a running task's worker: `{"output": text}` items as it prints, then one
        `{"exit_code": N, "reason": ...}`."""
        body = {"command": command, "worker": worker, "timeout_seconds": timeout}
        with self._streaming("POST", endpoints.exec_path(job_id), NDJSON, json=body) as resp:
            for line in resp.iter_lines():
                yield json.loads(line)

    @contextmanager
    def _streaming(
        self, method: str, url: str, expect: str, params: dict[str, Any] | None = None, json: Any = None
    ) -> Iterator[Stream]:
        """A response read as it comes; a refusal raised as `HaiError`, a connection lost on the way
        as `HaiConnectionLost`, none at all as `HaiUnreachable`."""
        answered = False
        try:
            with self._http.stream(method, url, params=params, json=json) as resp:
                answered = True
                if not _succeeded(resp, expect):
                    _raise_for(resp.read(), self.connection.server, f"{method} {url}", expect)
                yield resp
        except TransportError as e:
            lost = HaiConnectionLost if answered else HaiUnreachable
            raise lost(self.connection.server, e.kind) from None


class AsyncHaiClient:
    """The asyncio twin of `HaiClient` for what triggers and async code need (same parameters)."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        region: str | None = None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        on_behalf_of: str | None = None,
    ):
        self.connection = usable(resolve_connection(server, token, region))
        self.on_behalf_of = on_behalf_of
        headers = request_headers(self.connection.token, on_behalf_of)
        # httpx only here: the blocking client (the CLI's) runs on http11 and never imports it.
        import httpx

        self._http = httpx.AsyncClient(
            base_url=self.connection.server, headers=headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHaiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, expect: str = JSON, **kw: Any) -> httpx.Response:
        import httpx

        try:
            resp = await self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise HaiUnreachable(self.connection.server, type(e).__name__) from None
        _raise_for(resp, self.connection.server, f"{method} {path}", expect)
        return resp

    async def _call(self, call: Call[T]) -> T:
        return call.answer(await self._request(call.method, call.path, call.expect, **call.options()))

    # The endpoints async code needs, each as `HaiClient` has it.
    health = _awaited(endpoints.health)
    whoami = _awaited(endpoints.whoami)
    submit = _awaited(endpoints.submit)
    check_high_priority = _awaited(endpoints.check_high_priority)
    jobs = _awaited(endpoints.jobs)
    job = _awaited(endpoints.job)
    instances = _awaited(endpoints.instances)
    instance = _awaited(endpoints.instance)
    wait = _awaited(endpoints.wait)
    usage = _awaited(endpoints.usage)
    usage_history = _awaited(endpoints.usage_history)
    jobs_revision = _awaited(endpoints.jobs_revision)
    log = _awaited(endpoints.log)
    cancel = _awaited(endpoints.cancel)
    queue = _awaited(endpoints.queue)
    quota = _awaited(endpoints.quota)
    quotas = _awaited(endpoints.quotas)
    nodes = _awaited(endpoints.nodes)

    async def follow_log(self, instance_id: int, tail: int = 0) -> AsyncIterator[str]:
        import httpx

        params = {"tail": tail, "follow": True}
        url = endpoints.log_path(instance_id)
        try:
            async with self._http.stream("GET", url, params=params, timeout=None) as resp:
                if not _succeeded(resp, TEXT):
                    await resp.aread()
                    _raise_for(resp, self.connection.server, f"GET {url}", TEXT)
                async for chunk in resp.aiter_text():
                    yield chunk
        except httpx.TransportError as e:
            raise HaiUnreachable(self.connection.server, type(e).__name__) from None
