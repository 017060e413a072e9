"""Wake-ups between servers on one PostgreSQL database (LISTEN/NOTIFY): two `Store`s stand for two
`hai serve` processes, each with its own connections and origin."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from hai_airflow.server.api.app import create_app
from hai_airflow.server.process.context import ServerContext
from hai_airflow.server.store.channel import Listener, listener_name
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import JobRow
from tests.server.conftest import make_config
from tests.server.test_submission import _row
from tests.support import postgres

WAIT = 10.0


@pytest.fixture
def stores(pg_database: str) -> Iterator[tuple[Store, Store]]:
    postgres.reset_database(pg_database)
    first, second = Store(pg_database), Store(pg_database)
    first.migrate()
    yield first, second
    first.dispose()
    second.dispose()


class Heard:
    """Counts `on_change` calls and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.count = 0
        self._cond = threading.Condition()

    def __call__(self) -> None:
        with self._cond:
            self.count += 1
            self._cond.notify_all()

    def reaches(self, count: int, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= count, timeout)


@contextmanager
def listening(store: Store, heard: Heard) -> Iterator[Listener]:
    listener = store.listener(heard)
    assert listener is not None
    listener.start()
    try:
        assert heard.reaches(1), "a listener calls back once it listens (for what it missed)"
        yield listener
    finally:
        listener.stop()


def submit(store: Store, user: str = "alice") -> int:
    with store.write() as s:
        job = _row("PENDING", False, False, (user, "vision"), 1)
        s.add(job)
        s.flush()
        return job.id


def settled(store: Store, sent: int, quiet: int = 0) -> bool:
    """True once the store's announcer has sent `sent` notifications and skipped `quiet`."""
    announcer = store.announcer
    assert announcer is not None
    deadline = time.monotonic() + WAIT
    while (announcer.sent, announcer.quiet) < (sent, quiet):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_commit_in_one_process_wakes_the_others_and_not_itself(stores: tuple[Store, Store]) -> None:
    api, controller = stores
    heard_api, heard_controller = Heard(), Heard()
    with listening(api, heard_api), listening(controller, heard_controller):
        assert heard_api.reaches(2), "the API's process did not hear the controller's listener say hello"
        submit(controller)
        assert heard_api.reaches(3), "the controller's commit was not heard by the API's process"
        submit(api)
        assert heard_controller.reaches(2), "the API's commit was not heard by the controller's process"
        assert settled(api, 1) and settled(controller, 1)
        time.sleep(0.3)
        # Each heard the other's announcement, and not its own.
        assert (heard_api.count, heard_controller.count) == (3, 2)


def test_a_lone_server_announces_nothing_until_another_says_hello(stores: tuple[Store, Store]) -> None:
    api, controller = stores
    heard = Heard()
    with listening(api, heard):  # its own listener is not another process
        submit(api)
        assert settled(api, sent=0, quiet=1)
        heard_controller = Heard()
        with listening(controller, heard_controller):
            assert heard.reaches(2)  # the hello: the API's announcer knows at once, not in 5 s
            submit(api)
            assert settled(api, sent=1, quiet=1)
            assert heard_controller.reaches(2)


def test_a_lone_server_looks_for_listeners_once_in_a_while_not_at_every_commit(
    stores: tuple[Store, Store],
) -> None:
    api, _ = stores
    takers: list[str] = []
    event.listen(api.engine, "checkout", lambda *_: takers.append(threading.current_thread().name))
    for n in range(1, 6):
        submit(api)
        assert settled(api, sent=0, quiet=n)
    # The first announcement looked whether another process listens; the next four, within
    # OTHERS_SECONDS of that look, took no connection at all.
    assert takers.count("hai-announcer") == 1
    assert takers.count(threading.current_thread().name) == 5


def test_a_read_or_a_rolled_back_write_announces_nothing(stores: tuple[Store, Store]) -> None:
    api, controller = stores
    assert api.announcer is not None
    with listening(controller, Heard()):
        with api.read() as s:
            s.query(JobRow).count()
        with pytest.raises(RuntimeError), api.write() as s:
            s.add(_row("PENDING", False, False, ("alice", "vision"), 1))
            s.flush()
            raise RuntimeError("the submit fails after its insert")
        submit(api)
        assert settled(api, 1)
        time.sleep(0.3)
        assert (api.announcer.sent, api.announcer.quiet) == (1, 0)


def test_a_burst_of_commits_goes_out_as_a_few_notifications(stores: tuple[Store, Store]) -> None:
    api, controller = stores
    heard = Heard()
    with listening(controller, heard):
        for _ in range(50):
            submit(api)
        assert heard.reaches(2)
        api.dispose()  # sends what is still due
        assert api.announcer is not None
        assert 1 <= api.announcer.sent < 50
        assert heard.reaches(1 + api.announcer.sent)


def test_a_listener_whose_connection_dies_listens_again_and_calls_back(
    stores: tuple[Store, Store], pg_database: str
) -> None:
    api, controller = stores
    heard = Heard()
    with listening(controller, heard) as listener:
        name = pg_database.rsplit("/", 1)[1]
        with psycopg.connect(postgres.url_of(name).replace("+psycopg", ""), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s AND datname = %s",
                (listener_name(controller.origin), name),
            ).fetchone()
        assert killed is not None and killed[0] == 1
        # Announcements sent meanwhile are lost; the reconnect itself calls back for them.
        assert heard.reaches(2)
        assert listener.connects == 2
        submit(api)
        assert heard.reaches(3)


def test_a_sqlite_store_has_no_channel(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'hai.db'}")
    assert store.announcer is None
    assert store.listener(lambda: None) is None
    store.dispose()


def test_the_api_of_another_server_wakes_this_server(stores: tuple[Store, Store], tmp_path: Path) -> None:
    api, controller = stores
    ctx = ServerContext(store=controller, config=make_config(tmp_path), home=tmp_path)
    with TestClient(create_app(ctx)):  # the app listens while it is up
        deadline = time.monotonic() + WAIT
        while not ctx.wakeup.wait(0.05):  # the wake-up of the listener's first connect
            assert time.monotonic() < deadline
        ctx.wakeup.wait(0.3)  # and nothing else meanwhile
        submit(api)
        assert ctx.wakeup.wait(WAIT), "a submit through another server did not wake this controller"
