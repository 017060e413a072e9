"""`make demo`: an Airflow pipeline's training on hai is preempted by a high-priority job and resumes.
`make up` (``--up``): hai serve and Airflow's services, kept running until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dev.demo import REPO, log
from dev.demo.story import run_demo
from dev.demo.up import run_up


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.demo", description=__doc__)
    parser.add_argument("--steps", type=int, default=150, help="training steps of the pipeline")
    parser.add_argument(
        "--step-sleep", type=float, default=0.1, help="seconds per step, so there is time to preempt"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--up", action="store_true", help="instead: run hai serve + Airflow until Ctrl-C")
    parser.add_argument("--home", type=Path, default=REPO / ".hai" / "up", help="state directory of --up")
    parser.add_argument("--port", type=int, default=8765, help="hai serve port of --up")
    parser.add_argument("--airflow-port", type=int, default=8080, help="Airflow UI port of --up")
    parser.add_argument(
        "--airflow-host",
        default="127.0.0.1",
        help="address the Airflow UI of --up listens on (0.0.0.0: every interface)",
    )
    args = parser.parse_args(argv)
    with sigterm_as_interrupt():
        if args.up:
            try:
                return run_up(args.home, args.port, args.airflow_port, args.airflow_host)
            except KeyboardInterrupt:
                return 130
        work = Path(tempfile.mkdtemp(prefix="hai-demo-"))
        try:
            return run_demo(work, args.steps, args.step_sleep)
        except KeyboardInterrupt:
            log("interrupted; everything it started is stopped")
            return 130
        except RuntimeError as e:
            log(f"FAILED: {e}")
            for name in ("airflow-dags-test.log", "hai/server.log"):
                path = work / name
                if path.exists():
                    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
                    print(f"--- last lines of {path} ---\n" + "\n".join(tail), flush=True)
            return 1
        finally:
            if args.keep:
                log(f"kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
