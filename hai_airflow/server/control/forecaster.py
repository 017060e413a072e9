"""The forecaster: a background thread that forecasts the queue from what the controller last planned,
never on the controller's path. The controller only hands it references (`offer`), and the last plan
stays here for the queue view; a failure here is logged and counted, and scheduling goes on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from hai_airflow.scheduling.model import Decision, Snapshot, Wait
from hai_airflow.scheduling.runtime import RuntimeHistory
from hai_airflow.server.control.forked import run_apart
from hai_airflow.server.jobs.kept import KeptInstance, KeptJob
from hai_airflow.server.jobs.queue_forecast import Offer, QueueForecast, forecast_queue
from hai_airflow.server.jobs.runtime_history import recent_runs, runtime_facts
from hai_airflow.server.store import clock
from hai_airflow.server.store.database import Store

log = logging.getLogger("hai.server.forecaster")

REFRESH_SECONDS = 0.5
"""A new forecast at most this often, and only after the controller planned a changed cluster."""
REFRESH_FACTOR = 2.0
"""After a forecast that took t seconds, the next one waits at least REFRESH_FACTOR x t: the thread
takes at most a third of a CPU, and a large queue (2 s a forecast) is forecast every few seconds."""
BUDGET_SECONDS = 2.0
"""Wall-clock time one forecast may take; the jobs it has not reached by then show no start."""
HISTORY_SECONDS = 60.0
"""How long the recent runtimes read from the store are used before being read again."""


class Forecaster:
    """Keeps `latest`, the newest forecast, from the controller's offers."""

    def __init__(
        self,
        store: Store,
        refresh_seconds: float = REFRESH_SECONDS,
        budget_seconds: float = BUDGET_SECONDS,
        compute: Callable[[Offer, RuntimeHistory], QueueForecast] | None = None,
    ):
        self.store = store
        self.refresh_seconds = refresh_seconds
        self.budget_seconds = budget_seconds
        self.compute = compute if compute is not None else self._forecast
        self.latest: QueueForecast | None = None
        self.planned: Offer | None = None
        """The controller's last plan (an offer with its decisions): the queue view (`queue.current_plan`)
        is read from it, never planned again per request."""
        self.failures = 0
        self._offer: Offer | None = None
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._history: tuple[float, RuntimeHistory] | None = None

    def offer(
        self,
        snapshot: Snapshot,
        rows: Mapping[int, KeptJob],
        current: Mapping[int, KeptInstance],
        decisions: Sequence[Decision] | None = (),
    ) -> None:
        """The controller planned `snapshot` into `decisions`: forecast from it when the thread is next
        free. Only takes references (and shallow copies of the maps): it costs the controller next to
        nothing."""
        self._offer = Offer(snapshot, dict(rows), dict(current), clock.now(), decisions)
        if decisions is not None:
            self.planned = self._offer
        self._wake.set()

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="hai-forecaster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        due = float("-inf")
        while not self._stopping.is_set():
            self._wake.wait()
            # However often the controller plans, one forecast per pause; the first job to queue after
            # a quiet spell is forecast at once.
            if self._stopping.wait(max(0.0, due - time.monotonic())):
                return
            self._wake.clear()
            began = time.monotonic()
            if self.refresh():
                ended = time.monotonic()
                due = ended + max(self.refresh_seconds, REFRESH_FACTOR * (ended - began))

    def refresh(self) -> bool:
        """Forecast the latest offer, if any job waits in it (else the forecast is empty); a failure
        keeps the previous forecast and is logged. True when a forecast was attempted."""
        offer, self._offer = self._offer, None
        if offer is None:
            return False
        if offer.decisions is not None and not any(isinstance(d, Wait) for d in offer.decisions):
            self.latest = QueueForecast(at=offer.at)  # nothing is left waiting: nothing to forecast
            return False
        try:
            self.latest = self.compute(offer, self.history())
        except Exception:
            self.failures += 1
            log.exception("forecast failed; the previous one stays (scheduling is not affected)")
        return True

    def history(self) -> RuntimeHistory:
        """Recent runtimes, read from the store at most every HISTORY_SECONDS."""
        now = time.monotonic()
        if self._history is None or now - self._history[0] >= HISTORY_SECONDS:
            with self.store.read() as s:
                self._history = (now, RuntimeHistory.of(recent_runs(s)))
        return self._history[1]

    def _forecast(self, offer: Offer, history: RuntimeHistory) -> QueueForecast:
        """The forecast, computed apart (`run_apart`): not on the controller's interpreter lock."""
        began = time.perf_counter()

        def work() -> QueueForecast:
            facts = runtime_facts(offer.rows, offer.current, offer.at)
            return forecast_queue(offer.snapshot, facts, history, offer.at, self.budget_seconds)

        result = run_apart(work)
        return QueueForecast(
            result.at, result.jobs, result.horizon, result.complete, time.perf_counter() - began
        )
