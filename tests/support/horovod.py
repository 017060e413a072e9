"""An uninterrupted run of include/train_distributed.py as 2 workers x 2 ranks: the weights to expect.

It goes through the platform's own rank launcher (the same argv and variables a backend uses) on this
machine, outside any server, so a test compares a suspended and resumed job against it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hai_airflow.backends.common.workerenv import Gang, free_port, gang_env, launcher_argv, worker_slots
from hai_airflow.scheduling.model import WorkerPlacement

INCLUDE = Path(__file__).parents[2] / "include"
BIN = Path(sys.executable).parent
DETERMINISTIC = {"OMP_NUM_THREADS": "1", "HOROVOD_FUSION_THRESHOLD": "0"}
"""Without tensor fusion each gradient is reduced alone, with the same order of additions every run;
fused buffers fill in the order gradients become ready, which moves an element's place in the ring."""
TIMEOUT = 300.0


def run_reference(tmp: Path, args: str, env: dict[str, str]) -> Path:
    """Train `include/train_distributed.py ARGS` on 4 ranks to the end; its model dir."""
    model = tmp / "reference"
    model.mkdir()
    slots = worker_slots(tuple(WorkerPlacement(f"node{n}", (0, 1)) for n in (1, 2)))
    gang = Gang("127.0.0.1", free_port(), "127.0.0.1", free_port(), "lo", "127.0.0.1")
    cmd = f"exec python3 {INCLUDE / 'train_distributed.py'} {args} --model-dir {model}"
    base = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(tmp), **env}
    log_path = tmp / "reference.log"
    with log_path.open("w") as log:
        workers = [
            subprocess.Popen(
                launcher_argv(cmd, slot, gang),
                env=base | gang_env(slot, len(slots), gang),
                cwd=model,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for slot in slots
        ]
        try:
            codes = [w.wait(timeout=TIMEOUT) for w in workers]
        finally:
            for w in workers:
                if w.poll() is None:
                    os.killpg(w.pid, signal.SIGKILL)
                    w.wait()
    assert codes == [0, 0], log_path.read_text()[-3000:]
    return model
