"""A training-step loop that checkpoints periodically and saves and exits on a preemption notice."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from hai_airflow.training._stderr import note, warn
from hai_airflow.training.checkpointer import Checkpointer
from hai_airflow.training.distributed import any_rank, size
from hai_airflow.training.preemption import (
    EXIT_SAVED_ON_NOTICE,
    ignore_sigterm,
    install_preemption_handler,
    preemption_requested,
    restore_handler,
)


class TrainingLoop:
    """Yields step numbers, checkpoints every ``every`` steps and at the end, and on a preemption
    notice saves and exits the process with ``EXIT_SAVED_ON_NOTICE``, so an elastic job loses no step.

    Use it as a context manager: inside, SIGTERM only requests the save instead of killing.
    The notice is looked at between steps, so a step plus a save must fit in the platform's grace
    period. In a distributed job every rank must run the loop; the ranks agree after each step
    whether to stop (a one-number all-reduce), and only rank 0 writes.

    :param checkpointer: where checkpoints go.
    :param state: returns what to save, e.g. model and optimizer ``state_dict()`` s; called on
        every rank whenever a checkpoint is due (so it may be a collective), and rank 0 writes it.
    :param every: save after every this many completed steps.
    :param exit_code: the exit status after saving on notice.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        state: Callable[[], Any],
        every: int = 100,
        exit_code: int = EXIT_SAVED_ON_NOTICE,
    ) -> None:
        if every < 1:
            raise ValueError(f"every={every}: checkpoint at least every 1 step.")
        self.checkpointer = checkpointer
        self.state = state
        self.every = every
        self.exit_code = exit_code
        self.last_saved: int | None = None
        self._previous_handler: Any = None
        self._saved_on_notice = False

    def __enter__(self) -> TrainingLoop:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = install_preemption_handler()
        else:
            warn("TrainingLoop entered outside the main thread; only the notice file can stop it.")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._saved_on_notice:
            # The process is on its way out with "saved on notice" and SIGTERM is ignored (see
            # `_stop_and_exit`); putting a handler back would let a late one kill it.
            return
        restore_handler(self._previous_handler)
        self._previous_handler = None

    def steps(self, total: int, start: int = 0) -> Iterator[int]:
        """Yield ``start, start+1, ..., total-1``; the caller runs one training step per number.

        :param total: the number of steps the whole training run has.
        :param start: steps already done, i.e. the resumed checkpoint's ``step`` (0 on a first start).
        """
        self.last_saved = start if start > 0 else None
        done = start
        while done < total:
            yield done
            done += 1
            if done % self.every == 0 or done == total:
                self.save(done)
            if done < total and self._stop_requested():
                self.save(done)
                # Rank 0 may still be writing; the others wait, so the job's processes end together.
                any_rank(False)
                note(f"preemption notice: step {done} saved; exiting with {self.exit_code} to be resumed.")
                self._saved_on_notice = True
                # The platform writes the notice file and then sends SIGTERM: one landing after the
                # save, even while the interpreter shuts down, must not turn this exit into 143.
                ignore_sigterm()
                raise SystemExit(self.exit_code)

    def save(self, done: int) -> None:
        """Checkpoint ``done`` completed steps unless that is what the last save wrote."""
        if self.last_saved == done:
            return
        self.checkpointer.save(self.state(), done)
        self.last_saved = done

    def _stop_requested(self) -> bool:
        asked = preemption_requested()
        # Ranks must stop after the same step, or the ones left would hang in the next all-reduce.
        return any_rank(asked) if size() > 1 else asked
