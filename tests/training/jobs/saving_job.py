"""Test job without torch: checks the checkpoint it resumed from, then saves large checkpoints in a row."""

from __future__ import annotations

import hashlib
import sys
import time

from hai_airflow.training import Checkpointer

CHUNK = 1 << 20


class SlowChunk:
    """A megabyte that takes a moment to hand over, like a write to a busy network file system; it is
    written and read back as plain bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[object, ...]:
        time.sleep(0.006)
        return (bytes, (self.data,))


def payload(step: int, megabytes: int) -> bytes:
    return step.to_bytes(8, "little") * (megabytes * CHUNK // 8)


def main() -> int:
    directory, megabytes, saves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    checkpointer = Checkpointer(directory, keep=2)
    last = checkpointer.load_latest()
    step = 0
    if last is not None:
        state = last.state
        data = b"".join(state["chunks"])
        intact = (
            state["step"] == last.step
            and hashlib.sha256(data).hexdigest() == state["sha256"]
            and data == payload(last.step, megabytes)
        )
        print(f"resumed {last.step} {'intact' if intact else 'DAMAGED'}", flush=True)
        step = last.step
    else:
        print("resumed 0 fresh", flush=True)
    for _ in range(saves):
        step += 1
        data = payload(step, megabytes)
        chunks = [SlowChunk(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)]
        state = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "chunks": chunks}
        print(f"saving {step}", flush=True)
        began = time.perf_counter()
        checkpointer.save(state, step)
        print(f"saved {step} {time.perf_counter() - began:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
