"""Test job without torch: counts steps in a TrainingLoop, checkpointing a plain dict, until told to stop."""

from __future__ import annotations

import sys
import time

from hai_airflow.training import Checkpointer, TrainingLoop


def main() -> int:
    directory, total, every, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    checkpointer = Checkpointer(directory)
    last = checkpointer.load_latest()
    start = last.step if last else 0
    done = {"steps": start}
    print(f"started at {start}", flush=True)
    with TrainingLoop(checkpointer, lambda: dict(done), every=every) as loop:
        for step in loop.steps(total, start):
            time.sleep(pause)
            done["steps"] = step + 1
            print(f"step {step + 1}", flush=True)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
