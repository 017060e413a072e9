"""Helpers for training code on HAI: atomic checkpoints with auto-resume, the preemption notice, ranks,
and progress that survives a change of world size."""

from hai_airflow.training.checkpointer import Checkpoint, Checkpointer
from hai_airflow.training.distributed import (
    any_rank,
    device,
    is_chief,
    local_rank,
    local_size,
    rank,
    scaled_lr,
    size,
)
from hai_airflow.training.loop import TrainingLoop
from hai_airflow.training.preemption import (
    EXIT_SAVED_ON_NOTICE,
    install_preemption_handler,
    preemption_requested,
)
from hai_airflow.training.resizable import LinearScaling, Progress, SampleStream, resumed_progress

__all__ = [
    "EXIT_SAVED_ON_NOTICE",
    "Checkpoint",
    "Checkpointer",
    "LinearScaling",
    "Progress",
    "SampleStream",
    "TrainingLoop",
    "any_rank",
    "device",
    "install_preemption_handler",
    "is_chief",
    "local_rank",
    "local_size",
    "preemption_requested",
    "rank",
    "resumed_progress",
    "scaled_lr",
    "size",
]
