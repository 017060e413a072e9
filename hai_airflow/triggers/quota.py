"""HaiQuotaTrigger: waits until the caller's high-priority quota covers a number of GPUs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Literal

from airflow.triggers.base import BaseTrigger, TriggerEvent
from pydantic import BaseModel, ConfigDict, Field

from hai_airflow.client import HaiError
from hai_airflow.hooks.hai import DEFAULT_CONN_ID, HaiAsyncHook
from hai_airflow.hooks.retry import aretry_transient
from hai_airflow.triggers.serialized import serialized


class HaiQuotaEvent(BaseModel):
    """What :class:`HaiQuotaTrigger` emits (dumped to a dict)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: Literal["allowed", "error"] = Field(
        description="allowed: the quota covers the GPUs now; error: the check itself failed."
    )
    gpus: int = Field(description="The GPUs asked for.")
    reason: str = Field(default="", description="The server's words on the quota, or the error.")


class HaiQuotaTrigger(BaseTrigger):
    """Asks the server every `poll_interval` seconds whether `gpus` high-priority GPUs fit the quota.

    Quota frees when the caller's or the group's high-priority jobs end, which the server does not
    announce, so this trigger polls; the interval is long because quota waits are long.

    :param gpus: high-priority GPUs the job would hold.
    :param hai_conn_id: the Airflow connection to the hai server.
    :param poll_interval: seconds between checks.
    :param max_backoff: longest delay in seconds between reconnect attempts.
    :param on_behalf_of: the hai user the operator acted for (kept in the serialized trigger, so a
        resumed wait acts for the same person).
    """

    def __init__(
        self,
        gpus: int,
        hai_conn_id: str = DEFAULT_CONN_ID,
        poll_interval: float = 15.0,
        max_backoff: float = 60.0,
        on_behalf_of: str | None = None,
    ) -> None:
        super().__init__()
        self.gpus = int(gpus)
        self.hai_conn_id = hai_conn_id
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        self.on_behalf_of = on_behalf_of

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return serialized(self)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = HaiAsyncHook(self.hai_conn_id, on_behalf_of=self.on_behalf_of)
        said = ""
        async with await hook.get_conn() as client:
            while True:
                try:
                    check = await aretry_transient(
                        lambda: client.check_high_priority(self.gpus),
                        what="checking the high-priority quota",
                        log=self.log,
                        max_backoff=self.max_backoff,
                    )
                except HaiError as e:
                    yield TriggerEvent(
                        HaiQuotaEvent(status="error", gpus=self.gpus, reason=e.message).model_dump()
                    )
                    return
                reason = str(check.get("reason") or "")
                if check.get("allowed"):
                    yield TriggerEvent(
                        HaiQuotaEvent(status="allowed", gpus=self.gpus, reason=reason).model_dump()
                    )
                    return
                if reason != said:
                    self.log.info("waiting for high-priority quota for %s GPUs: %s", self.gpus, reason)
                    said = reason
                await asyncio.sleep(self.poll_interval)
