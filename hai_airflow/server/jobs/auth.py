"""Who is calling: Bearer tokens, roles, a service acting for a user, and which jobs and groups a
caller may act on."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from hai_airflow.server.acting import ON_BEHALF_OF, covers
from hai_airflow.server.errors import ApiError
from hai_airflow.server.store.tables import GroupRow, InstanceRow, JobRow, UserRow
from hai_airflow.server.store.tokens import same_hash, token_hash
from hai_airflow.spec import TERMINAL_STATES, JobState


@dataclass(frozen=True)
class Caller:
    name: str
    group: str
    role: str
    admin_of: frozenset[str]
    """Groups this caller administers (their own as group_admin, or listed as a group's admin)."""
    via: str | None = None
    """The service identity acting for this user (`X-Hai-On-Behalf-Of`), or `job N` for the credential
    of job N; None when the user calls."""
    job_id: int | None = None
    """The job whose credential made the request (`hai` inside a job, `HAI_TOKEN_FILE`); None for an
    API token. Such a caller is its job's owner with a user's rights only (`JOB_ROUTES`)."""

    @property
    def is_platform_admin(self) -> bool:
        """A platform admin calling with their own token (never through a job's credential)."""
        return self.role == "platform_admin" and self.job_id is None

    @property
    def actor(self) -> str:
        """Who acted, as events record it: the user, and the service when one acted for them."""
        return self.name if self.via is None else f"{self.name} via {self.via}"

    def administers(self, group: str) -> bool:
        return self.is_platform_admin or group in self.admin_of

    def may_set_quota_of(self, user: str, group: str) -> bool:
        """A group admin sets the quotas of the others in her group; her own, like a group's, is set
        by a platform admin (the platform document's roles)."""
        return self.is_platform_admin or (user != self.name and group in self.admin_of)

    def may_see(self, user: str, group: str) -> bool:
        """Users see their own jobs, group admins their group's, platform admins all."""
        return user == self.name or self.administers(group)


_NO_TOKEN_FIX = (
    "Send `Authorization: Bearer <token>`: set HAI_TOKEN or use the $HAI_HOME/token that hai serve wrote"
)


IDENTITY_SECONDS = 5.0
"""How long this server reuses a caller it verified before asking the store again. Identities change
only when a server applies its config file (at its start): another server started with an edited file
takes effect here within this long; a restart of this one, at once."""
IDENTITIES_KEPT = 4096


class Identities:
    """Callers verified lately, by token hash and the user named in `X-Hai-On-Behalf-Of`: a repeated
    request costs no store transaction. Only a verified caller is kept; a refusal is decided afresh."""

    def __init__(self, seconds: float = IDENTITY_SECONDS):
        self.seconds = seconds
        self._known: dict[tuple[str, str | None], tuple[float, Caller]] = {}

    def get(self, key: tuple[str, str | None]) -> Caller | None:
        entry = self._known.get(key)
        if entry is None or entry[0] <= time.monotonic():
            return None
        return entry[1]

    def put(self, key: tuple[str, str | None], caller: Caller) -> None:
        if len(self._known) >= IDENTITIES_KEPT:
            self._known = {}  # a burst of distinct tokens: start over rather than grow
        self._known[key] = (time.monotonic() + self.seconds, caller)


def _presented(request: Request) -> tuple[str, str | None]:
    """The keyed hash of the request's token and the user it names to act for."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "missing API token", field="Authorization", fix=_NO_TOKEN_FIX)
    # The lookup is on the keyed hash, so its timing says nothing about the token; the final
    # comparison is constant-time all the same.
    return token_hash(request.app.state.ctx.store.token_key, token.strip()), request.headers.get(ON_BEHALF_OF)


async def authenticate(request: Request) -> Caller:
    """The caller of this request: the token's user, or the user its service names in `X-Hai-On-Behalf-Of`.

    A caller verified within `IDENTITY_SECONDS` is answered from memory, on the event loop; otherwise
    the store is read in a worker thread.
    """
    key = _presented(request)
    known = request.app.state.ctx.identities.get(key)
    if known is not None:
        return known
    return await run_in_threadpool(verify, request, key)


def verify(request: Request, key: tuple[str, str | None] | None = None) -> Caller:
    """`authenticate` from the store, for code running in a worker thread.

    A job credential is looked up afresh on every request, never kept: it stops acting the moment
    its instance ends or its job is cancelled."""
    presented, named = key or _presented(request)
    ctx = request.app.state.ctx
    with ctx.store.read() as s:
        user = s.scalar(select(UserRow).where(UserRow.token_hash == presented))
        if user is None or not same_hash(user.token_hash, presented):
            caller = _job_caller(s, presented, named)
        elif named is None:
            caller = _caller(s, user)
        else:
            acted_for = _acted_for(s, user, named)
            caller = _caller(s, acted_for, None if acted_for.name == user.name else user.name)
    if caller.job_id is not None:
        _require_job_route(request, caller)
        return caller
    ctx.identities.put((presented, named), caller)
    return caller


def user_caller(s: Session, name: str) -> Caller | None:
    """User `name` as a caller of their own (None when there is no such user): whom a requeue of
    their job submits as, whoever asked for it."""
    user = s.get(UserRow, name)
    return None if user is None else _caller(s, user)


def _caller(s: Session, user: UserRow, via: str | None = None) -> Caller:
    admin_of = set()
    for g in s.scalars(select(GroupRow)):
        if user.name in json.loads(g.admins or "[]"):
            admin_of.add(g.name)
    if user.role == "group_admin":
        admin_of.add(user.group_name)
    return Caller(
        name=user.name, group=user.group_name, role=user.role, admin_of=frozenset(admin_of), via=via
    )


def _acted_for(s: Session, service: UserRow, named: str) -> UserRow:
    """The user `service` names in the header, if its `acts_for` covers them; otherwise a refusal."""
    if not named.strip():
        raise ApiError(
            400,
            f"{ON_BEHALF_OF} is empty",
            field=ON_BEHALF_OF,
            fix="Send the name of the hai user to act for, or leave the header out to act as yourself",
        )
    acts_for = json.loads(service.acts_for or "[]")
    if not acts_for:
        raise ApiError(
            403,
            f"{service.name} is not a service identity, so it may not act for {named!r}",
            field=ON_BEHALF_OF,
            fix=f"Leave out {ON_BEHALF_OF} to act as {service.name}, or ask the platform admin to give "
            f"{service.name} `acts_for` in its [[users]] entry of the server config",
        )
    user = s.get(UserRow, named)
    if user is None:
        raise ApiError(
            403,
            f"{ON_BEHALF_OF} names {named!r}, who is not a hai user",
            field=ON_BEHALF_OF,
            fix="Name a user of the server config's [[users]] (the Airflow user must have a hai user "
            "of the same name)",
        )
    if not covers(acts_for, user.name, user.group_name):
        raise ApiError(
            403,
            f"{service.name} may not act for {user.name} (group {user.group_name}): "
            f"not in its acts_for {acts_for}",
            field=ON_BEHALF_OF,
            fix=f'Add "{user.name}" or "group:{user.group_name}" to acts_for of user {service.name} in '
            f"the server config, or let {user.name} submit with their own token",
        )
    return user


# ---- job credentials ----------------------------------------------------------------------------

JOB_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {
        ("GET", "/api/v1/whoami"),
        ("GET", "/api/v1/resource-packages"),
        ("GET", "/api/v1/quota"),
        ("GET", "/api/v1/quota/check"),
        ("GET", "/api/v1/queue"),
        ("POST", "/api/v1/jobs"),
        ("GET", "/api/v1/jobs"),
        ("GET", "/api/v1/jobs/revision"),
        ("GET", "/api/v1/jobs/{job_id}"),
        ("GET", "/api/v1/jobs/{job_id}/instances"),
        ("GET", "/api/v1/jobs/{job_id}/wait"),
        ("POST", "/api/v1/jobs/{job_id}/cancel"),
        ("GET", "/api/v1/instances/{instance_id}"),
        ("GET", "/api/v1/instances/{instance_id}/log"),
    }
)
"""What a job credential may ask (method, route): submit, list, wait for, read the logs of and cancel
its owner's jobs, and read what a submit needs. Anything else (quotas, nodes, holds, exec, files,
/metrics, every admin action) is refused with 403, whoever owns the job."""

_CREDENTIAL_FIX = "Run it with your own API token (HAI_TOKEN), outside the job"


def _job_caller(s: Session, presented: str, named: str | None) -> Caller:
    """The owner of the job whose live credential hashes to `presented`, with a user's rights only;
    401 for a token that is no credential, or one whose instance ended or whose job was cancelled."""
    inst = s.scalar(select(InstanceRow).where(InstanceRow.credential_hash == presented))
    if inst is None or inst.credential_hash is None or not same_hash(inst.credential_hash, presented):
        raise ApiError(401, "unknown API token", field="Authorization", fix=_NO_TOKEN_FIX)
    job = s.get(JobRow, inst.job_id)
    gone = _credential_ended(inst, job)
    if gone is not None or job is None:
        raise ApiError(
            401,
            f"this job credential no longer acts: {gone}",
            field="Authorization",
            fix="A job's credential works only while that run of the job runs; outside it, use your "
            "own API token (HAI_TOKEN)",
        )
    if named is not None:
        raise ApiError(
            403,
            f"the credential of task {job.id} acts only for its owner {job.user_name}; it may not send "
            f"{ON_BEHALF_OF}",
            field=ON_BEHALF_OF,
            fix=f"Leave out {ON_BEHALF_OF}",
        )
    owner = s.get(UserRow, job.user_name)
    if owner is None:
        raise ApiError(
            401,
            f"this job credential no longer acts: {job.user_name}, who owns task {job.id}, is no longer a "
            "hai user",
            field="Authorization",
            fix="Ask the platform admin",
        )
    # A user's rights, whatever the owner's role: a job administers nothing (`is_platform_admin`).
    return Caller(
        name=owner.name,
        group=owner.group_name,
        role=owner.role,
        admin_of=frozenset(),
        via=f"job {job.id}",
        job_id=job.id,
    )


def _credential_ended(inst: InstanceRow, job: JobRow | None) -> str | None:
    """Why the credential of `inst` acts no more, or None while its run goes on."""
    if job is None:
        return f"its task {inst.job_id} is gone"
    if inst.ended_at is not None or job.current_instance_id != inst.id:
        return f"instance {inst.id} of task {job.id} ended"
    if job.cancel_requested or job.state == JobState.CANCELLED:
        return f"task {job.id} was cancelled"
    if job.state in TERMINAL_STATES:
        return f"task {job.id} ended ({job.state})"
    return None


def _require_job_route(request: Request, caller: Caller) -> None:
    """Refuse (403) what a job credential may not ask, naming why."""
    route = getattr(request.scope.get("route"), "path", None) or request.url.path
    if (request.method, route) in JOB_ROUTES:
        return
    admin = f" (though its owner {caller.name} is a {caller.role})" if caller.role != "user" else ""
    raise ApiError(
        403,
        f"the credential of task {caller.job_id} may not {request.method} {route}{admin}: a job's "
        "credential only submits, lists, waits for, reads the logs of and cancels its owner's tasks",
        field="Authorization",
        fix=_CREDENTIAL_FIX,
    )
