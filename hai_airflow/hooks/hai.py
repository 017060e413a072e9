"""Hooks over the hai client; the `hai` connection holds the server URL, a token and a region."""

from __future__ import annotations

from typing import Any, TypedDict

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from hai_airflow.client import AsyncHaiClient, HaiClient
from hai_airflow.hooks.identity import Acting, hai_user_name, user_map
from hai_airflow.spec import InstanceView

DEFAULT_CONN_ID = "hai_default"


class ClientArguments(TypedDict):
    server: str | None
    token: str | None
    region: str | None


def client_arguments(conn: Any | None) -> ClientArguments:
    """`server`, `token` and `region` for a client, from an Airflow connection (None = environment).

    The host may be a full URL (``http://hai:8765``) or a bare host name with the port and
    the scheme (``schema``: http or https) in their own fields. Empty fields fall back to the
    client's own lookup: ``HAI_SERVER``, ``HAI_TOKEN``, ``HAI_REGION`` and ``$HAI_HOME``.
    """
    if conn is None:
        return {"server": None, "token": None, "region": None}
    host = (conn.host or "").strip()
    server: str | None = None
    if host:
        if "://" in host:
            server = host
            if conn.port and host.count(":") == 1:
                server = f"{host.rstrip('/')}:{conn.port}"
        else:
            scheme = conn.schema if conn.schema in ("http", "https") else "http"
            server = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
    extra = conn.extra_dejson if conn.extra else {}
    return {"server": server, "token": conn.password or None, "region": extra.get("region") or None}


def latest_instance(instances: list[InstanceView]) -> InstanceView | None:
    """The job's newest run (highest instance id)."""
    return max(instances, key=lambda i: i.id, default=None)


class _HaiConnectionHook(BaseHook):
    """What both hooks are made of: the `hai` connection, the request timeout and the user to act for."""

    conn_name_attr = "hai_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "hai"

    def __init__(
        self, hai_conn_id: str = DEFAULT_CONN_ID, timeout: float = 30.0, on_behalf_of: str | None = None
    ) -> None:
        super().__init__()
        self.hai_conn_id = hai_conn_id
        self.timeout = timeout
        self.on_behalf_of = on_behalf_of


class HaiHook(_HaiConnectionHook):
    """Talks to the hai server through :class:`~hai_airflow.client.HaiClient`.

    The connection (type ``hai``) holds the server URL in *host*, the API token in *password*
    and, optionally, ``{"region": "..."}`` in *extra*. When the default connection
    ``hai_default`` is not defined, the client's own lookup is used (``HAI_SERVER``,
    ``HAI_TOKEN``, ``HAI_REGION``, ``$HAI_HOME``), as for the ``hai`` command.

    A token of a *service identity* (``acts_for`` in the server config) acts for the person
    behind each run: :meth:`act_for` names them, and every request then carries
    ``X-Hai-On-Behalf-Of``. The connection extra ``user_map`` maps Airflow user names to hai
    user names where they differ (``{"alice@corp.com": "alice"}``); unmapped names are the same.

    :param hai_conn_id: the Airflow connection to use.
    :param timeout: seconds for ordinary requests.
    :param on_behalf_of: the hai user to act for (None: the token's own user).
    """

    hook_name = "HAI training platform"
    _client: HaiClient | None = None

    def _connection(self) -> Any | None:
        try:
            return self.get_connection(self.hai_conn_id)
        except AirflowNotFoundException:
            if self.hai_conn_id != DEFAULT_CONN_ID:
                raise
            self.log.info("%s is not defined; using HAI_SERVER, HAI_TOKEN and $HAI_HOME", DEFAULT_CONN_ID)
            return None

    def get_conn(self) -> HaiClient:
        """The client for this connection (one per hook), acting for `on_behalf_of` when set."""
        if self._client is None:
            self._client = HaiClient(
                **client_arguments(self._connection()), timeout=self.timeout, on_behalf_of=self.on_behalf_of
            )
        return self._client

    def act_for(self, airflow_user: str) -> Acting:
        """Make this hook act for `airflow_user` (through ``user_map``), checked with the server.

        When that is the token's own user no header is sent, so a personal token works as before;
        otherwise the server must allow the token's service identity to act for them.

        :raises HaiError: the server refused (403 names what to change in its config).
        :raises ValueError: the connection's ``user_map`` is malformed.
        """
        conn = self._connection()
        extra = conn.extra_dejson if conn is not None and conn.extra else {}
        user = hai_user_name(airflow_user, user_map(extra))
        self.close()
        self.on_behalf_of = None
        token_user = self.get_conn().whoami()
        if token_user.get("user") != user:
            self.close()
            self.on_behalf_of = user
        who = self.get_conn().whoami()
        return Acting(
            user=str(who["user"]),
            group=str(who.get("group") or ""),
            on_behalf_of=self.on_behalf_of,
            token_user=str(token_user.get("user")),
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def server_url(self) -> str:
        return self.get_conn().connection.server

    def test_connection(self) -> tuple[bool, str]:
        """Used by the UI's *Test* button: whoami against the server."""
        try:
            who = self.get_conn().whoami()
        except Exception as e:
            return False, str(e)
        return True, f"Connected to {self.server_url()} as {who.get('user', who)}"

    def log_tail(self, job_id: int, lines: int) -> list[str]:
        """The last `lines` lines of the job's newest instance log ([] when it never started)."""
        client = self.get_conn()
        newest = latest_instance(client.instances(job_id))
        if newest is None or lines <= 0:
            return []
        return client.log(newest.id, tail=lines).splitlines()[-lines:]


class HaiAsyncHook(_HaiConnectionHook):
    """The asyncio twin of :class:`HaiHook`, for triggers.

    :param hai_conn_id: the Airflow connection to use.
    :param timeout: seconds for ordinary requests.
    :param on_behalf_of: the hai user to act for (None: the token's own user); a trigger keeps
        the one its operator acted for.
    """

    hook_name = "HAI training platform (async)"

    async def _connection(self) -> Any | None:
        try:
            return await self.aget_connection(self.hai_conn_id)
        except AirflowNotFoundException:
            if self.hai_conn_id != DEFAULT_CONN_ID:
                raise
            return None

    async def get_conn(self) -> AsyncHaiClient:
        """A new client; the caller closes it (``async with``)."""
        return AsyncHaiClient(
            **client_arguments(await self._connection()), timeout=self.timeout, on_behalf_of=self.on_behalf_of
        )

    async def log_tail(self, client: AsyncHaiClient, job_id: int, lines: int) -> list[str]:
        """The last `lines` lines of the job's newest instance log ([] when it never started)."""
        newest = latest_instance(await client.instances(job_id))
        if newest is None or lines <= 0:
            return []
        return (await client.log(newest.id, tail=lines)).splitlines()[-lines:]
