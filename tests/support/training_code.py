"""The job code a training test puts where its jobs read it, as a user would have it on the NAS."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_training_code(dest: Path) -> Path:
    """The sample scripts (`include/`) and the training helpers they import (`hai_airflow.training`)."""
    shutil.copytree(REPO / "include", dest / "include")
    (dest / "hai_airflow").mkdir()
    shutil.copy(REPO / "hai_airflow" / "__init__.py", dest / "hai_airflow")
    shutil.copytree(REPO / "hai_airflow" / "training", dest / "hai_airflow" / "training")
    return dest
