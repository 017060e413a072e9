"""The Airflow asset of a hai job's model directory: what its checkpoints and final model update."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import Asset, AssetWatcher

from hai_airflow.hooks.hai import DEFAULT_CONN_ID
from hai_airflow.triggers.checkpoint import HaiCheckpointWatchTrigger, checkpoint_step, same_dir


def model_asset(model_dir: str) -> Asset:
    """The asset of `model_dir`; operators emit its events, checkpoint watchers and DAGs schedule on it."""
    return Asset(name=f"hai-model:{model_dir}", uri=f"file://{model_dir}")


def watched_model_asset(
    model_dir: str,
    job_id: int | None = None,
    hai_conn_id: str = DEFAULT_CONN_ID,
    hai_user: str | None = None,
    poll_interval: float = 30.0,
) -> Asset:
    """`model_dir`'s asset with a watcher: a DAG scheduled on it runs for each new checkpoint.

    :param model_dir: the model directory; without `job_id`, every job saving there is watched.
    :param job_id: watch only this job's checkpoints (the asset is still `model_dir`'s).
    :param hai_conn_id: the Airflow connection to the hai server.
    :param hai_user: the hai user whose jobs the watcher looks at, when the connection's token is a
        service identity that may act for them.
    :param poll_interval: seconds between the watcher's looks.
    """
    trigger = HaiCheckpointWatchTrigger(
        job_id=job_id,
        model_dir=None if job_id is not None else model_dir,
        hai_conn_id=hai_conn_id,
        hai_user=hai_user,
        poll_interval=poll_interval,
    )
    asset = model_asset(model_dir)
    watched = f"job-{job_id}" if job_id is not None else model_dir
    return Asset(
        name=asset.name,
        uri=asset.uri,
        watchers=[AssetWatcher(name=f"hai-checkpoints:{watched}", trigger=trigger)],
    )


def checkpoints_in(extras: Iterable[Mapping[str, Any]], model_dir: str | None = None) -> list[dict[str, Any]]:
    """The checkpoints named by asset events' extras, oldest first, each once.

    A watcher's event keeps its trigger's payload under ``payload`` (``checkpoint``, ``step``);
    an operator's names the newest checkpoint as ``path``, or the model dir itself when the job
    saved none: such events, and events without a path, are left out.

    :param model_dir: the asset's model directory, so that an event naming only it is skipped.
    """
    found: dict[str, dict[str, Any]] = {}
    for extra in extras:
        payload = extra.get("payload", extra)
        if not isinstance(payload, Mapping):
            continue
        path = payload.get("checkpoint") or payload.get("path")
        if not path or (model_dir and same_dir(str(path), model_dir)):
            continue
        step = payload.get("step")
        found[str(path)] = {
            "checkpoint": str(path),
            "step": step if step is not None else checkpoint_step(str(path)),
            "job_id": payload.get("job_id"),
        }
    return list(found.values())
