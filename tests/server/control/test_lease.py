"""The controller's lease (`server/store/lease.py`): only its holder acts, and a deposed controller
cannot write."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from hai_airflow.backends.local.backend import LocalBackend
from hai_airflow.server.control.controller import Controller
from hai_airflow.server.store.lease import LeaseLost
from hai_airflow.server.store.tables import LeaseRow


def test_only_the_lease_holder_acts_and_a_deposed_one_cannot_write(api_factory: Any) -> None:
    api = api_factory()
    first = api.with_controller()
    first.step()
    assert first.active
    other_api = api_factory()  # same database, another controller identity
    second = Controller(other_api.ctx, LocalBackend({}, other_api.ctx.home))
    other_api.controller = second
    second.step()
    assert not second.active
    assert api.get("/health", user=None).json()["lease_holder"] == first.me

    with api.ctx.store.write() as s:  # the lease runs out while the first controller stalls
        s.execute(update(LeaseRow).values(expires_at=0.0))
    second.step()
    assert second.active
    with pytest.raises(LeaseLost), first.lease.write():
        pass
    api.submit(cmd="true")
    first.active = True  # a stalled controller that still believes it leads
    with pytest.raises(LeaseLost):
        first.step(force=True)
    assert api.job(1)["state"] == "PENDING"  # nothing admitted by the deposed controller
