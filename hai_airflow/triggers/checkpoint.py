"""Checkpoint triggers: wait for one newer checkpoint, or report each new one to an asset watcher."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatch
from functools import partial
from pathlib import Path
from typing import Any, Literal

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent
from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.client import AsyncHaiClient, HaiError
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiAsyncHook
from hai_airflow.hooks.retry import aretry_transient
from hai_airflow.spec import TERMINAL_STATES, JobState, JobView
from hai_airflow.triggers.serialized import serialized

DEFAULT_PATTERN = "checkpoint-*"
_UNFINISHED = ("*.tmp", "*.tmp-*", "*.temp", "*.partial", "*.part", "*.lock", ".*", "*~")


@dataclass(frozen=True)
class CheckpointSeen:
    """A checkpoint file: where, its training step (from the name) and when it was written."""

    path: str
    step: int | None
    saved_at: datetime | None


def checkpoint_step(path: str) -> int | None:
    """The step in a checkpoint's name: its last number (``checkpoint-00000120.pt`` -> 120)."""
    numbers = re.findall(r"\d+", Path(path).name.split(".", 1)[0])
    return int(numbers[-1]) if numbers else None


def is_newer(seen: CheckpointSeen, newer_than: datetime | None, after_step: int | None) -> bool:
    """A checkpoint counts when it is past every mark given (no marks: any checkpoint counts)."""
    if after_step is not None and (seen.step is None or seen.step <= after_step):
        return False
    return newer_than is None or (seen.saved_at is not None and seen.saved_at > newer_than)


def newest_in_path(path: str, pattern: str = DEFAULT_PATTERN) -> CheckpointSeen | None:
    """The newest finished checkpoint at `path` (a file, or a directory searched with `pattern`)."""
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = [
            f
            for f in root.iterdir()
            if f.is_file() and fnmatch(f.name, pattern) and not any(fnmatch(f.name, u) for u in _UNFINISHED)
        ]
    else:
        return None
    seen = [_seen(f) for f in files]
    return max(
        seen,
        key=lambda s: (s.step if s.step is not None else -1, s.saved_at or datetime.min.replace(tzinfo=UTC)),
        default=None,
    )


def _seen(file: Path) -> CheckpointSeen:
    try:
        saved_at: datetime | None = datetime.fromtimestamp(file.stat().st_mtime, tz=UTC)
    except OSError:
        saved_at = None
    return CheckpointSeen(path=str(file), step=checkpoint_step(file.name), saved_at=saved_at)


def job_checkpoint(job: JobView) -> CheckpointSeen | None:
    """The newest checkpoint the server has recorded for the job."""
    if not job.latest_checkpoint:
        return None
    return CheckpointSeen(
        path=job.latest_checkpoint,
        step=checkpoint_step(job.latest_checkpoint),
        saved_at=job.latest_checkpoint_at,
    )


def same_dir(a: str, b: str) -> bool:
    """The same model directory, however the paths were written (``/m/x/`` and ``/m//x``)."""
    return os.path.normpath(a) == os.path.normpath(b)


def newest_of_jobs(jobs: Iterable[JobView], model_dir: str) -> tuple[CheckpointSeen, JobView] | None:
    """The newest checkpoint the server recorded for any of `jobs` that saves to `model_dir`."""
    found = [
        (seen, job)
        for job in jobs
        if job.spec.get("model_dir") and same_dir(str(job.spec["model_dir"]), model_dir)
        if (seen := job_checkpoint(job)) is not None
    ]
    return max(found, key=lambda f: checkpoint_order(f[0]), default=None)


def checkpoint_order(seen: CheckpointSeen) -> tuple[datetime, str]:
    """Checkpoints in the order they were written (path breaks ties, so the order is total)."""
    return (seen.saved_at or datetime.min.replace(tzinfo=UTC), seen.path)


def is_later(seen: CheckpointSeen, last: CheckpointSeen | None) -> bool:
    """A checkpoint is new to a watcher when written after the last one it reported."""
    return last is None or checkpoint_order(seen) > checkpoint_order(last)


def parse_time(value: datetime | str | None) -> datetime | None:
    """An aware datetime from a datetime or an ISO 8601 string (naive = UTC)."""
    if value is None or value == "":
        return None
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class HaiCheckpointEvent(BaseModel):
    """What :class:`HaiCheckpointTrigger` emits (dumped to a dict)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["found", "job_ended", "error"] = Field(
        description="found: a newer checkpoint exists; job_ended: the job ended without one; "
        "error: the trigger could not follow the job (see message)."
    )
    checkpoint: str | None = Field(default=None, description="Path of the checkpoint found.")
    step: int | None = Field(default=None, description="Its step, read from the file name.")
    saved_at: datetime | None = Field(default=None, description="When it was written.")
    job_id: int | None = Field(default=None, description="The job watched, or the job that wrote it.")
    job_state: JobState | None = Field(default=None, description="The job's state at the event.")
    model_dir: str | None = Field(default=None, description="The model directory watched, if any.")
    message: str = Field(default="", description="Why the trigger gave up (status error).")

    @classmethod
    def found(
        cls, seen: CheckpointSeen, job: JobView | None = None, model_dir: str | None = None
    ) -> HaiCheckpointEvent:
        return cls(
            status="found",
            checkpoint=seen.path,
            step=seen.step,
            saved_at=seen.saved_at,
            job_id=job.id if job else None,
            job_state=job.state if job else None,
            model_dir=model_dir,
        )


class HaiCheckpointTrigger(BaseTrigger):
    """Fires when a checkpoint newer than `newer_than` and past `after_step` appears.

    With `job_id`, the checkpoint is the newest the server recorded for that job (or, when `path`
    is given too, the newest file there), and the trigger also fires, with ``job_ended``, if the
    job ends without one. With only `path`, it watches that file or directory.

    :param job_id: the hai job whose checkpoints count.
    :param path: a checkpoint file or a directory of them, on storage this machine mounts.
    :param pattern: file-name glob of checkpoints inside a directory `path`.
    :param newer_than: ISO 8601 time the checkpoint must be written after.
    :param after_step: step the checkpoint must be past.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param poll_interval: seconds between looks.
    :param max_backoff: longest delay in seconds between reconnect attempts.
    """

    def __init__(
        self,
        job_id: int | None = None,
        path: str | None = None,
        pattern: str = DEFAULT_PATTERN,
        newer_than: str | None = None,
        after_step: int | None = None,
        hai_conn_id: str = DEFAULT_CONN_ID,
        poll_interval: float = 10.0,
        max_backoff: float = 30.0,
    ) -> None:
        super().__init__()
        if job_id is None and not path:
            raise ValueError("HaiCheckpointTrigger needs `job_id` or `path`")
        self.job_id = int(job_id) if job_id is not None else None
        self.path = path or None
        self.pattern = pattern
        when = parse_time(newer_than)
        self.newer_than = when.isoformat() if when else None
        self.after_step = int(after_step) if after_step is not None else None
        self.hai_conn_id = hai_conn_id
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return serialized(self)

    def _wanted(self, seen: CheckpointSeen | None) -> bool:
        return seen is not None and is_newer(seen, parse_time(self.newer_than), self.after_step)

    async def _in_path(self) -> CheckpointSeen | None:
        assert self.path is not None
        return await asyncio.to_thread(newest_in_path, self.path, self.pattern)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        if self.job_id is None:
            while not self._wanted(seen := await self._in_path()):
                await asyncio.sleep(self.poll_interval)
            assert seen is not None
            yield TriggerEvent(HaiCheckpointEvent.found(seen).model_dump(mode="json"))
            return
        hook = HaiAsyncHook(self.hai_conn_id)
        async with await hook.get_conn() as client:
            event = await self._watch_job(client, self.job_id)
        yield TriggerEvent(event.model_dump(mode="json"))

    async def _watch_job(self, client: AsyncHaiClient, job_id: int) -> HaiCheckpointEvent:
        state: str | None = None
        while True:
            try:
                # the long-poll doubles as the sleep between looks and wakes early when the job ends
                job = await aretry_transient(
                    partial(client.wait, job_id, since_state=state, timeout=self.poll_interval),
                    what=f"watching hai job {job_id} for a checkpoint",
                    log=self.log,
                    max_backoff=self.max_backoff,
                )
            except HaiError as e:
                return HaiCheckpointEvent(status="error", job_id=job_id, message=e.message)
            state = job.state
            seen = await self._in_path() if self.path else job_checkpoint(job)
            if self._wanted(seen):
                assert seen is not None
                return HaiCheckpointEvent.found(seen, job)
            if job.state in TERMINAL_STATES:
                return HaiCheckpointEvent(status="job_ended", job_id=job.id, job_state=job.state)


class HaiCheckpointWatchTrigger(BaseEventTrigger):
    """Fires once for each new checkpoint the hai server records, for an ``AssetWatcher``.

    Watches one job (`job_id`) or every job that saves to a model directory (`model_dir`), as
    the server sees them (``latest_checkpoint`` of ``hai task``), so it needs no access to the
    files. Each event carries the checkpoint's path and step; a DAG scheduled on an asset with
    this watcher runs once per event (events that arrive while a run is being created are given
    to one run together: read them all from ``triggering_asset_events``). Checkpoints written
    faster than `poll_interval` count as their newest. The first look reports the newest
    checkpoint that already exists; where the triggerer keeps asset state (Airflow 3.3), the
    last one reported is remembered there, so a restarted triggerer does not report it again.

    It never ends, as the triggerer expects of a watcher: transient errors are retried with
    jittered backoff, and a refusal (an unknown job, a token that may not see it) is logged and
    tried again every `max_backoff` seconds until the connection or the DAG is fixed.

    :param job_id: the hai job whose checkpoints count.
    :param model_dir: count the checkpoints of every job (of those the connection may see) whose
        ``model_dir`` is this directory, e.g. each resubmission of a training.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param hai_user: the hai user to look as, when the connection is a service identity that may
        act for them (a watcher has no run, so nobody else to act for); None: the token's own user.
    :param poll_interval: seconds between looks.
    :param max_backoff: longest delay in seconds between attempts while the server does not answer.
    """

    def __init__(
        self,
        job_id: int | None = None,
        model_dir: str | None = None,
        hai_conn_id: str = DEFAULT_CONN_ID,
        hai_user: str | None = None,
        poll_interval: float = 30.0,
        max_backoff: float = 300.0,
    ) -> None:
        super().__init__()
        if (job_id is None) == (not model_dir):
            raise ValueError("HaiCheckpointWatchTrigger needs exactly one of `job_id` and `model_dir`")
        self.job_id = int(job_id) if job_id is not None else None
        self.model_dir = model_dir or None
        self.hai_conn_id = hai_conn_id
        self.hai_user = hai_user or None
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return serialized(self)

    @property
    def watched(self) -> str:
        return f"hai job {self.job_id}" if self.job_id is not None else f"model dir {self.model_dir}"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last = await self._recall()
        hook = HaiAsyncHook(self.hai_conn_id, on_behalf_of=self.hai_user)
        async with await hook.get_conn() as client:
            state: str | None = None
            while True:
                try:
                    found, state = await self._look(client, state)
                except HaiError as e:
                    self.log.error(
                        "cannot watch %s, trying again in %g s: %s", self.watched, self.max_backoff, e.message
                    )
                    await asyncio.sleep(self.max_backoff)
                    continue
                if found is not None and is_later(found[0], last):
                    seen, job = found
                    last = seen
                    self.log.info("new checkpoint of %s: %s (step %s)", self.watched, seen.path, seen.step)
                    yield TriggerEvent(
                        HaiCheckpointEvent.found(seen, job, self.model_dir).model_dump(mode="json")
                    )
                    await self._remember(seen)

    async def _look(
        self, client: AsyncHaiClient, state: str | None
    ) -> tuple[tuple[CheckpointSeen, JobView] | None, str | None]:
        """The newest recorded checkpoint and its job, after waiting up to `poll_interval`."""
        if self.job_id is not None:
            # the long-poll is the wait between looks; it returns early only when the state changes
            job = await aretry_transient(
                partial(client.wait, self.job_id, since_state=state, timeout=self.poll_interval),
                what=f"watching {self.watched} for checkpoints",
                log=self.log,
                max_backoff=self.max_backoff,
            )
            seen = job_checkpoint(job)
            return ((seen, job) if seen else None), job.state
        assert self.model_dir is not None
        jobs = await aretry_transient(
            partial(client.jobs, all=True),
            what=f"watching {self.watched} for checkpoints",
            log=self.log,
            max_backoff=self.max_backoff,
        )
        found = newest_of_jobs(jobs, self.model_dir)
        await asyncio.sleep(self.poll_interval)
        return found, None

    # ---- the last checkpoint reported, in the triggerer's asset state (when it keeps one) --------

    @property
    def _state_key(self) -> str:
        return f"hai-checkpoint-watch:{self.watched}"

    async def _recall(self) -> CheckpointSeen | None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return None
        try:
            kept = await store.aget(self._state_key)
        # Remembering is an optimisation: a store that cannot answer means one repeated event.
        except Exception as e:
            self.log.warning("could not read the last checkpoint reported for %s: %s", self.watched, e)
            return None
        if not isinstance(kept, dict) or not kept.get("path"):
            return None
        path = str(kept["path"])
        return CheckpointSeen(
            path=path, step=checkpoint_step(path), saved_at=parse_time(kept.get("saved_at"))
        )

    async def _remember(self, seen: CheckpointSeen) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return
        value = {"path": seen.path, "saved_at": seen.saved_at.isoformat() if seen.saved_at else None}
        try:
            await store.aset(self._state_key, value)
        except Exception as e:
            self.log.warning("could not keep the last checkpoint reported for %s: %s", self.watched, e)
