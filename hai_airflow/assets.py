"""The Airflow asset of a hai job's model directory: what its checkpoints and final model update."""

from __future__ import annotations

from airflow.sdk import Asset


def model_asset(model_dir: str) -> Asset:
    """The asset of `model_dir`; operators emit its events, checkpoint watchers and DAGs schedule on it."""
    return Asset(name=f"hai-model:{model_dir}", uri=f"file://{model_dir}")
