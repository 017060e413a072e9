"""Waiting for a backend's exits, as the controller would poll for them."""

from __future__ import annotations

import time

from hai_airflow.backends.common.base import Backend, Exit


def ended_within(backend: Backend, instance_id: int, timeout: float) -> Exit:
    """Poll `backend` until the instance's Exit comes; fail if it takes longer than `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ended in backend.poll():
            assert ended.instance_id == instance_id, f"unexpected exit {ended}"
            return ended
        time.sleep(0.05)
    raise AssertionError(f"instance {instance_id} did not end within {timeout} s")
