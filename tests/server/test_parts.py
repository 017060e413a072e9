"""The server's small parts without a server: config, hints, checkpoints, exit outcomes, migrations."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import update

from hai_airflow.backends.common.base import Exit
from hai_airflow.scheduling import POLICIES
from hai_airflow.server.config import (
    DEFAULT_CHECKPOINT_DIRECTORIES,
    DEFAULT_CHECKPOINT_IGNORE,
    DEFAULT_CHECKPOINT_PATTERNS,
    DEFAULT_PORT,
    ConfigError,
    default_config_text,
    parse_config,
)
from hai_airflow.server.jobs.checkpoints import Counted, newest_checkpoint
from hai_airflow.server.jobs.hints import failure_hint, is_ampere_or_newer
from hai_airflow.server.jobs.transitions import exit_outcome
from hai_airflow.server.provision import apply_config
from hai_airflow.server.serve import load_or_create_config
from hai_airflow.server.store import lease
from hai_airflow.server.store.database import Store
from hai_airflow.server.store.tables import Base, InstanceRow, JobRow, LeaseRow, UserRow
from hai_airflow.server.store.tokens import token_hash
from hai_airflow.spec import NodeConfig
from tests.support.live_server import TEST_CONFIG

# ---- config -----------------------------------------------------------------------------------


def test_the_default_config_parses_and_has_the_documents_packages() -> None:
    config = parse_config(default_config_text(None, os_user="ops"), policies=sorted(POLICIES))
    p457 = next(p for p in config.resource_packages if p.id == 457)
    assert (p457.gpus, p457.gpu_type, p457.cpus, p457.memory_gb) == (8, "V100", 32, 256)
    assert sorted(p.gpus for p in config.resource_packages if p.gpu_type == "V100") == [1, 2, 4, 8]
    assert any(p.gpus == 0 for p in config.resource_packages)
    assert [(n.gpus, n.gpu_type, n.virtual) for n in config.nodes] == [(8, "V100", True)]
    assert [(u.name, u.role, u.group) for u in config.users] == [("ops", "platform_admin", "default")]
    assert config.groups[0].admins == ("ops",)
    assert config.checkpoints.patterns == DEFAULT_CHECKPOINT_PATTERNS


def test_detected_gpus_replace_the_virtual_node_and_get_packages() -> None:
    found = [NodeConfig(name="gpu-host", gpu_type="H200", gpus=8, cpus=128, memory_gb=1024, virtual=False)]
    config = parse_config(default_config_text(found, os_user="ops"))
    assert [(n.name, n.gpu_type, n.virtual) for n in config.nodes] == [("gpu-host", "H200", False)]
    assert sorted(p.gpus for p in config.resource_packages if p.gpu_type == "H200") == [1, 2, 4, 8]


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        pytest.param("[server]\nport = 70000\n", "server.port", "65535", id="port"),
        pytest.param("[server]\nhots = 'x'\n", "server.hots", "Extra inputs", id="typo in a key"),
        pytest.param(
            "[[users]]\nname = 'a'\n[[users]]\nname = 'a'\n", "users[1].name", "twice", id="duplicate user"
        ),
        pytest.param(
            "[[groups]]\nname = 'g'\nadmins = ['ghost']\n",
            "groups[0].admins",
            "not a configured user",
            id="admin",
        ),
        pytest.param("[storages]\nabc = '/x'\n", "storages.abc", "integer", id="storage id not a number"),
        pytest.param(
            "[checkpoints]\npatterns = []\n", "checkpoints.patterns", "at least 1", id="no patterns"
        ),
        pytest.param("[server]\npolicy = 'coinflip'\n", "server.policy", "coinflip", id="policy"),
    ],
)
def test_config_errors_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, Path("/etc/hai.toml"), policies=sorted(POLICIES))
    assert e.value.field == field
    assert words in e.value.problem
    assert str(e.value).startswith(f"bad config /etc/hai.toml at {field}: ")


def test_the_test_config_is_valid() -> None:
    config = parse_config(TEST_CONFIG, policies=sorted(POLICIES))
    assert {u.name for u in config.users} == {"admin", "alice", "bob", "carol", "dave"}


# ---- failure hints ----------------------------------------------------------------------------

LOG = "Traceback ...\nRuntimeError: CUDA error: no kernel image is available for execution on the device\n"


@pytest.mark.parametrize(
    ("gpu", "ampere"),
    [
        ("A100", True), ("A800", True), ("A10", True), ("A30", True), ("A40", True), ("H100", True),
        ("H800", True), ("H200", True), ("L4", True), ("L40", True), ("L40S", True), ("RTX 3090", True),
        ("RTX 4090", True), ("GeForce RTX 3080 Ti", True), ("RTX A6000", True),
        ("V100", False), ("P100", False), ("T4", False), ("K80", False), ("RTX 2080", False), (None, False),
    ],
)  # fmt: skip
def test_ampere_or_newer(gpu: str | None, ampere: bool) -> None:
    assert is_ampere_or_newer(gpu) is ampere


def test_the_hint_needs_both_the_error_and_a_new_gpu() -> None:
    hint = failure_hint("A100", LOG)
    assert hint is not None and "CUDA 11+" in hint and "A100" in hint
    assert failure_hint("V100", LOG) is None
    assert failure_hint("A100", "RuntimeError: out of memory") is None


# ---- checkpoints ------------------------------------------------------------------------------


def touch(path: Path, at: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (at, at))
    return path


COUNTED = Counted(DEFAULT_CHECKPOINT_PATTERNS, DEFAULT_CHECKPOINT_IGNORE, DEFAULT_CHECKPOINT_DIRECTORIES)


def test_any_complete_file_counts_but_not_temp_names_nor_dotfiles(tmp_path: Path) -> None:
    now = time.time()
    touch(tmp_path / "epoch1.pt", now - 30)
    best = touch(tmp_path / "sub" / "model_latest.pth", now - 20)
    touch(tmp_path / "epoch3.pt.tmp", now - 10)
    touch(tmp_path / ".epoch4.pt", now - 5)
    touch(tmp_path / ".hidden" / "epoch5.pt", now - 4)
    touch(tmp_path / "epoch6.pt~", now - 3)
    found = newest_checkpoint(tmp_path, COUNTED)
    assert found is not None and found.path == str(best)
    assert newest_checkpoint(tmp_path / "missing", COUNTED) is None


def test_metrics_logs_and_configs_beside_the_checkpoints_never_count(tmp_path: Path) -> None:
    """A run that ends by writing metrics.json beside final.pt (the example trainer does) resumes
    from final.pt, and a checkpoint directory's own config.json still counts with it."""
    now = time.time()
    best = touch(tmp_path / "final.pt", now - 30)
    for name in ("metrics.json", "train.log", "loss.csv", "hparams.yaml", "events.out.tfevents.1.host"):
        touch(tmp_path / name, now - 1)
    found = newest_checkpoint(tmp_path, COUNTED)
    assert found is not None and found.path == str(best)
    whole = touch(tmp_path / "checkpoint-500" / "config.json", now)
    found = newest_checkpoint(tmp_path, COUNTED)
    assert found is not None and found.path == str(whole.parent)


def test_an_admin_may_narrow_the_names_that_count(tmp_path: Path) -> None:
    now = time.time()
    best = touch(tmp_path / "epoch1.pt", now - 30)
    touch(tmp_path / "metrics.json", now)
    narrowed = Counted(("*.pt",), DEFAULT_CHECKPOINT_IGNORE, DEFAULT_CHECKPOINT_DIRECTORIES)
    found = newest_checkpoint(tmp_path, narrowed)
    assert found is not None and found.path == str(best)


def test_a_name_that_is_not_utf8_is_never_a_checkpoint_nor_searched_below(tmp_path: Path) -> None:
    now = time.time()
    best = touch(tmp_path / "epoch1.pt", now - 30)
    touch(tmp_path / os.fsdecode(b"epoch2-\xff.pt"), now - 20)  # bytes the store cannot hold
    touch(tmp_path / os.fsdecode(b"run-\xfe") / "epoch3.pt", now - 10)
    found = newest_checkpoint(tmp_path, COUNTED)
    assert found is not None and found.path == str(best)


def test_a_checkpoint_directory_counts_as_a_whole_and_a_link_never_counts(tmp_path: Path) -> None:
    now = time.time()
    hf = tmp_path / "checkpoint-500"
    touch(hf / "model.bin", now - 20)
    os.utime(hf, (now - 20, now - 20))
    (tmp_path / "latest.pt").symlink_to(hf / "model.bin")  # newer, but a link
    found = newest_checkpoint(tmp_path, COUNTED)
    assert found is not None and found.path == str(hf)


# ---- exit outcomes ----------------------------------------------------------------------------


def _rows(stop_kind: str | None = None, cancel: bool = False) -> tuple[JobRow, InstanceRow]:
    job = JobRow(id=1, state="RUNNING", cancel_requested=cancel, cancel_by="alice" if cancel else None,
                 held_by="carol")  # fmt: skip
    inst = InstanceRow(
        id=7, job_id=1, stop_kind=stop_kind, preempted_by=9 if stop_kind == "preempt" else None
    )
    return job, inst


@pytest.mark.parametrize(
    ("stop_kind", "cancel", "exit", "expected"),
    [
        pytest.param(None, False, Exit(7, 0, "exited 0"), ("completed", "SUCCEEDED"), id="exit 0 succeeds"),
        pytest.param(None, False, Exit(7, 2, "exit code 2"), ("failed", "FAILED"), id="non-zero fails"),
        pytest.param(
            "preempt", False, Exit(7, -9, "killed"), ("preempted", "SUSPENDED"), id="kill is preemption"
        ),
        pytest.param(
            "preempt", False, Exit(7, 0, "ok"), ("preempted", "SUSPENDED"), id="exit in grace is clean"
        ),
        pytest.param("hold", False, Exit(7, -15, "term"), ("suspended", "SUSPENDED"), id="admin hold"),
        pytest.param("cancel", True, Exit(7, -15, "term"), ("cancelled", "CANCELLED"), id="cancel"),
        pytest.param(
            "preempt", True, Exit(7, -9, "kill"), ("cancelled", "CANCELLED"), id="cancel beats preempt"
        ),
        pytest.param(
            None, False, Exit(7, None, "vanished", lost=True), ("lost", "SUSPENDED"), id="lost requeues"
        ),
        pytest.param("timeout", False, Exit(7, -9, "kill"), ("timeout", "TIMEOUT"), id="time limit"),
        pytest.param("timeout", False, Exit(7, 75, "saved"), ("timeout", "TIMEOUT"), id="saved at limit"),
        pytest.param(
            "timeout", False, Exit(7, 0, "done"), ("completed", "SUCCEEDED"), id="done within the grace"
        ),
        pytest.param(
            "timeout", True, Exit(7, -9, "kill"), ("cancelled", "CANCELLED"), id="cancel beats timeout"
        ),
    ],
)
def test_exit_outcome(stop_kind: str | None, cancel: bool, exit: Exit, expected: tuple[str, str]) -> None:
    job, inst = _rows(stop_kind, cancel)
    outcome = exit_outcome(job, inst, exit)
    assert (outcome.end_reason, outcome.job_state) == expected


def test_a_failure_reason_carries_the_code_and_the_hint() -> None:
    job, inst = _rows()
    outcome = exit_outcome(job, inst, Exit(7, 1, "exit code 1"), hint="use CUDA 11+")
    assert outcome.reason == "exit code 1. use CUDA 11+"


# ---- migrations -------------------------------------------------------------------------------


def test_migrations_build_exactly_the_models_schema(db_url: str) -> None:
    store = Store(db_url)
    try:
        store.migrate()
        store.migrate()  # a second start finds nothing to do
        with store.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
    finally:
        store.dispose()


# ---- lease and provisioning (on both stores) --------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_lease_goes_to_one_holder_and_a_dead_local_holder_is_replaced_at_once(db_url: str) -> None:
    store = Store(db_url)
    try:
        store.migrate()
        now = time.time()
        host = socket.gethostname()
        alive = f"{host}:{os.getppid()}:a"
        with store.write() as s:
            assert lease.try_acquire(s, alive, now)
        with store.write() as s:
            assert not lease.try_acquire(s, "elsewhere:1:b", now)
        with store.write() as s:
            assert lease.try_acquire(s, "elsewhere:1:b", now + lease.LEASE_SECONDS + 1)  # expired
        dead = f"{host}:{_dead_pid()}:c"
        with store.write() as s:
            s.execute(update(LeaseRow).values(holder=dead, expires_at=now + 60))
        with store.write() as s:
            assert lease.try_acquire(s, alive, now)  # its predecessor on this host is gone
        with pytest.raises(lease.LeaseLost), store.write() as s:
            lease.renew(s, "elsewhere:1:b", now)
    finally:
        store.dispose()


def test_config_quotas_apply_once_and_api_changes_survive_a_restart(db_url: str) -> None:
    store = Store(db_url)
    try:
        store.migrate()
        config = parse_config(TEST_CONFIG)
        apply_config(store, config, list(config.nodes))
        with store.write() as s:
            user = s.get(UserRow, "alice")
            assert user is not None and user.quota_gpus == 8
            user.quota_gpus = 2  # changed through the API
        apply_config(store, config, list(config.nodes))  # a restart with the same file
        with store.read() as s:
            assert s.get(UserRow, "alice").quota_gpus == 2  # type: ignore[union-attr]
        edited = parse_config(TEST_CONFIG.replace("quota_gpus = 8\ntoken", "quota_gpus = 16\ntoken"))
        apply_config(store, edited, list(edited.nodes))
        with store.read() as s:
            assert s.get(UserRow, "alice").quota_gpus == 16  # type: ignore[union-attr]
            stored = s.get(UserRow, "alice").token_hash  # type: ignore[union-attr]
            assert stored == token_hash(store.token_key, "alice-token")
    finally:
        store.dispose()


def test_the_first_start_writes_the_port_and_host_it_was_given(tmp_path: Path) -> None:
    """`hai serve --port 18777` on a fresh home: the config it writes says 18777, so the next start
    without flags listens where the first did (and the CLI's users were told)."""
    config = load_or_create_config(None, tmp_path, "127.0.0.2", 18777)
    assert (config.server.host, config.server.port) == ("127.0.0.2", 18777)
    assert "port = 18777\n" in (tmp_path / "config.toml").read_text()
    assert load_or_create_config(None, tmp_path).server.port == 18777  # kept, not rewritten
    assert load_or_create_config(None, tmp_path / "other").server.port == DEFAULT_PORT
