"""What the API and the controller share inside one `hai serve` process."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hai_airflow.server.config import ServerConfig
from hai_airflow.server.jobs.auth import Identities
from hai_airflow.server.jobs.queue_forecast import Offer, QueueForecast
from hai_airflow.server.process.metrics import ServerMetrics
from hai_airflow.server.process.notify import Broadcast, Wakeup
from hai_airflow.server.store.database import Store
from hai_airflow.spec import ResourcePackage


class Forecasts(Protocol):
    """What the controller's forecaster offers the API: its newest forecast and the last plan."""

    latest: QueueForecast | None
    planned: Offer | None


@dataclass
class ServerContext:
    store: Store
    config: ServerConfig
    home: Path
    wakeup: Wakeup = field(default_factory=Wakeup)
    """Set by the API after a submit or request, so the controller acts at once."""
    changed: Broadcast = field(default_factory=Broadcast)
    """Notified by the controller after job states changed, so long-polls answer at once."""
    stopping: threading.Event = field(default_factory=threading.Event)
    """Set when `hai serve` is asked to stop: long-polls answer and followed logs break off at once."""
    identities: Identities = field(default_factory=Identities)
    """Callers the API verified lately (`auth.IDENTITY_SECONDS`)."""
    holder_id: str = ""
    """This process's controller identity (the lease holder name when it holds the lease)."""
    listen_url: str | None = None
    """Where this server listens, as a job on this machine reaches it (`HAI_SERVER` of local jobs); set
    by `hai serve` once it knows its address, None where the API is not served over a socket."""
    forecaster: Forecasts | None = None
    """The controller's forecaster (its `latest` forecast of the queue); None until a controller runs here."""
    metrics: ServerMetrics = field(init=False)
    """Fed by the controller and the API, exported at /metrics; one registry per context."""

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.store, self.holder_id)

    def stop_serving(self) -> None:
        """The server is stopping: wake every long-poll and follower so none holds the shutdown up."""
        self.stopping.set()
        self.changed.notify()

    def heard(self) -> None:
        """Another process committed changes (`channel.Listener`): plan and answer long-polls at once."""
        self.wakeup.set()
        self.changed.notify()

    @property
    def forecast(self) -> QueueForecast | None:
        """The newest forecast of the queue, if this server's controller has made one."""
        return self.forecaster.latest if self.forecaster is not None else None

    @property
    def packages(self) -> dict[int, ResourcePackage]:
        return {p.id: p for p in self.config.resource_packages}

    @property
    def storages(self) -> dict[int, str]:
        return {sid: storage.path for sid, storage in self.config.storages.items()}

    def jobs_dir(self, job_id: int) -> Path:
        return self.home / "jobs" / str(job_id)
