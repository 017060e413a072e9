"""Rank helpers: the launcher's environment, an initialised Horovod, and the process's device."""

from __future__ import annotations

import sys
import types

import pytest

from hai_airflow.training import (
    any_rank,
    device,
    is_chief,
    local_rank,
    local_size,
    rank,
    scaled_lr,
    size,
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, (0, 1, 0, 1), id="no launcher: one process"),
        pytest.param(
            {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "16", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "8"},
            (5, 16, 1, 8),
            id="horovod variables",
        ),
        pytest.param(
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            (3, 4, 1, 2),
            id="torch.distributed variables",
        ),
        pytest.param(
            {
                "OMPI_COMM_WORLD_RANK": "9",
                "OMPI_COMM_WORLD_SIZE": "12",
                "OMPI_COMM_WORLD_LOCAL_RANK": "3",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            },
            (9, 12, 3, 4),
            id="open mpi variables",
        ),
        pytest.param(
            {"HOROVOD_RANK": "2", "RANK": "7", "HOROVOD_SIZE": "8", "WORLD_SIZE": "9"},
            (2, 8, 0, 1),
            id="horovod before torch",
        ),
        pytest.param(
            {"RANK": "1", "OMPI_COMM_WORLD_RANK": "4", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "8"},
            (1, 2, 0, 1),
            id="torch before open mpi",
        ),
        pytest.param(
            {"RANK": " ", "WORLD_SIZE": "", "OMPI_COMM_WORLD_RANK": "2"}, (2, 1, 0, 1), id="blank is unset"
        ),
    ],
)
def test_ranks_from_the_launcher_environment(
    env: dict[str, str], expected: tuple[int, int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (rank(), size(), local_rank(), local_size()) == expected
    assert is_chief() == (expected[0] == 0)
    assert scaled_lr(0.1) == pytest.approx(0.1 * expected[1])


def test_a_malformed_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        size()


def fake_horovod(initialised: bool) -> types.ModuleType:
    hvd = types.ModuleType("horovod.torch")
    hvd.is_initialized = lambda: initialised  # type: ignore[attr-defined]
    hvd.rank = lambda: 6  # type: ignore[attr-defined]
    hvd.size = lambda: 8  # type: ignore[attr-defined]
    hvd.local_rank = lambda: 2  # type: ignore[attr-defined]
    hvd.local_size = lambda: 4  # type: ignore[attr-defined]
    return hvd


def test_an_initialised_horovod_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setitem(sys.modules, "horovod.torch", fake_horovod(initialised=True))
    assert (rank(), size(), local_rank(), local_size()) == (6, 8, 2, 4)


def test_an_uninitialised_horovod_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setitem(sys.modules, "horovod.torch", fake_horovod(initialised=False))
    assert rank() == 1


def test_device_is_the_cpu_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device() == torch.device("cpu")


def test_device_is_the_local_ranks_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device() == torch.device("cuda", 3)
    # One GPU made visible per process: every local rank uses device 0.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert device() == torch.device("cuda", 0)


def test_any_rank_in_a_single_process_is_the_flag_itself() -> None:
    assert any_rank(True) is True
    assert any_rank(False) is False
