"""The preemption notice an elastic job watches for, written the same way by every backend."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from hai_airflow.backends.common.safefs import trusted_root, write_below

log = logging.getLogger(__name__)


def write_notice(path: Path, instance_id: int, grace_seconds: int, home: Path | None) -> None:
    """Create the notice atomically and without following a link the job may have planted at `path`."""
    deadline = time.time() + grace_seconds
    body = {"instance_id": instance_id, "grace_seconds": grace_seconds, "deadline": deadline}
    # Readable by the job's user, which need not be the server's.
    write_below(trusted_root(path, home), path, (json.dumps(body) + "\n").encode(), mode=0o644)


def give_notice(path: Path, instance_id: int, grace_seconds: int, home: Path | None) -> None:
    """Write the notice of a stop; one that cannot be written is logged, and the stop goes on."""
    try:
        write_notice(path, instance_id, grace_seconds, home)
    except OSError as e:
        # The job broke its own work dir; it still gets SIGTERM and the grace.
        log.warning("cannot write the notice of instance %d: %s", instance_id, e)
