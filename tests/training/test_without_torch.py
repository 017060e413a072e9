"""The helpers import and checkpoint plain state where torch is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .launch import job_env

WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # makes `import torch` fail as if it were not installed
from hai_airflow.training import Checkpointer, TrainingLoop, device, rank, size
assert "torch" not in [m for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] == "torch"]
checkpointer = Checkpointer(sys.argv[1])
checkpointer.save({"v": 1}, 1)
loaded = checkpointer.load_latest()
print(loaded.step, loaded.state["v"], rank(), size())
try:
    device()
except ImportError:
    print("device needs torch")
"""


def test_imports_and_checkpoints_without_torch(tmp_path: Path) -> None:
    # A newer checkpoint written by torch.save cannot be read here; the plain one below it is.
    (tmp_path / "checkpoint-00000002.pt").write_bytes(b"PK\x03\x04 a torch archive")
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(tmp_path)],
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["1 1 0 1", "device needs torch"]
    assert "torch is not installed" in result.stderr
