"""Checkpointer: atomic saves, rotation, damaged files skipped, first start, rank 0 only, torch and plain."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from hai_airflow.training import Checkpointer


class ExplodesWhenPickled:
    """Stands for a save that dies half-way through writing the file."""

    def __reduce__(self) -> tuple[object, ...]:
        raise RuntimeError("disk went away")


def names(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def test_first_start_returns_none_and_creates_nothing(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "model")
    assert checkpointer.load_latest() is None
    assert checkpointer.checkpoints() == []
    assert not (tmp_path / "model").exists()


def test_resume_without_a_checkpoint_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HAI_RESUME", "1")
    assert Checkpointer(tmp_path).load_latest() is None
    assert "HAI_RESUME=1" in capsys.readouterr().err


def test_plain_dict_round_trips_through_pickle(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    path = checkpointer.save({"weights": [1.0, 2.5], "epoch": 3}, step=1234)
    assert path == tmp_path / "checkpoint-00001234.pkl"
    with open(path, "rb") as raw:
        assert pickle.load(raw) == {"weights": [1.0, 2.5], "epoch": 3}
    loaded = checkpointer.load_latest()
    assert loaded is not None
    assert (loaded.step, loaded.state, loaded.path) == (1234, {"weights": [1.0, 2.5], "epoch": 3}, path)


def test_torch_state_round_trips_through_torch_save(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    checkpointer = Checkpointer(tmp_path)
    path = checkpointer.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step=7)
    assert path == tmp_path / "checkpoint-00000007.pt"
    assert torch.load(path, weights_only=False)["model"]["weight"].shape == (2, 3)

    loaded = checkpointer.load_latest()
    assert loaded is not None and loaded.step == 7
    fresh = torch.nn.Linear(3, 2)
    fresh.load_state_dict(loaded.state["model"])
    assert torch.equal(fresh.weight, model.weight)
    assert loaded.state["optimizer"]["state"][0]["step"] == 1


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path, keep=3)
    for step in (10, 20, 30, 40, 50):
        checkpointer.save({"step": step}, step)
    assert names(tmp_path) == [f"checkpoint-000000{s}.pkl" for s in (30, 40, 50)]
    assert [p.name for p in checkpointer.checkpoints()] == [f"checkpoint-000000{s}.pkl" for s in (50, 40, 30)]


def test_saving_the_same_step_again_replaces_it(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save({"v": 1}, 5)
    checkpointer.save({"v": 2}, 5)
    loaded = checkpointer.load_latest()
    assert names(tmp_path) == ["checkpoint-00000005.pkl"]
    assert loaded is not None and loaded.state == {"v": 2}


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_damaged_newest_is_skipped_with_a_warning(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save({"step": 1, "blob": b"x" * 10_000}, 1)
    newest = checkpointer.save({"step": 2, "blob": b"y" * 10_000}, 2)
    assert newest is not None
    size = newest.stat().st_size
    with open(newest, "r+b") as file:
        if damage == "truncated":
            file.truncate(size // 2)
        elif damage == "empty":
            file.truncate(0)
        else:
            file.write(b"\x00garbage" * 10)
    loaded = checkpointer.load_latest()
    assert loaded is not None and loaded.step == 1 and loaded.state["blob"] == b"x" * 10_000
    err = capsys.readouterr().err
    assert "skipping checkpoint" in err and str(newest) in err


def test_truncated_torch_checkpoint_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save({"w": torch.zeros(1000)}, 1)
    newest = checkpointer.save({"w": torch.ones(1000)}, 2)
    assert newest is not None
    with open(newest, "r+b") as file:
        file.truncate(newest.stat().st_size - 100)
    loaded = checkpointer.load_latest()
    assert loaded is not None and loaded.step == 1 and float(loaded.state["w"].sum()) == 0.0
    assert str(newest) in capsys.readouterr().err


def test_all_damaged_is_a_first_start(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-00000003.pkl").write_bytes(b"")
    assert Checkpointer(tmp_path).load_latest() is None


def test_failed_save_leaves_the_last_good_checkpoint_and_no_litter(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path, keep=1)
    checkpointer.save({"good": True}, 1)
    with pytest.raises(RuntimeError, match="disk went away"):
        checkpointer.save({"good": False, "oops": ExplodesWhenPickled()}, 2)
    assert names(tmp_path) == ["checkpoint-00000001.pkl"]
    loaded = checkpointer.load_latest()
    assert loaded is not None and loaded.state == {"good": True}


def test_temp_file_left_by_a_killed_save_is_ignored_then_removed(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save({"v": 1}, 1)
    leftover = tmp_path / ".checkpoint-00000002.tmp-99999"
    leftover.write_bytes(b"half a checkpoint")
    loaded = checkpointer.load_latest()
    assert loaded is not None and loaded.step == 1
    checkpointer.save({"v": 3}, 3)
    assert not leftover.exists()
    assert names(tmp_path) == ["checkpoint-00000001.pkl", "checkpoint-00000003.pkl"]


def test_only_rank_0_writes_but_every_rank_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Checkpointer(tmp_path / "shared").save({"v": 1}, 4)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    other = Checkpointer(tmp_path / "shared")
    assert other.save({"v": 2}, 5) is None
    assert Checkpointer(tmp_path / "unwritten").save({"v": 2}, 5) is None
    assert not (tmp_path / "unwritten").exists()
    loaded = other.load_latest()
    assert loaded is not None and (loaded.step, loaded.state) == (4, {"v": 1})


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"HAI_MODEL_DIR": "m"}, "m", id="model dir"),
        pytest.param({"HAI_CHECKPOINT_DIR": "c", "HAI_MODEL_DIR": "m"}, "c", id="checkpoint dir wins"),
        pytest.param({}, "checkpoints", id="by hand: ./checkpoints"),
    ],
)
def test_directory_defaults_from_the_platform(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Checkpointer().dir == Path(expected)


def test_latest_checkpoint_from_the_platform_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = Checkpointer(tmp_path / "dir")
    here.save({"from": "dir"}, 10)
    elsewhere = Checkpointer(tmp_path / "elsewhere")
    named = elsewhere.save({"from": "platform"}, 20)
    monkeypatch.setenv("HAI_LATEST_CHECKPOINT", str(named))
    loaded = here.load_latest()
    assert loaded is not None and (loaded.step, loaded.state) == (20, {"from": "platform"})

    here.save({"from": "dir, newer"}, 30)
    loaded = here.load_latest()
    assert loaded is not None and loaded.state == {"from": "dir, newer"}


def test_latest_checkpoint_with_another_name_serves_when_the_directory_has_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named = tmp_path / "best.ckpt"
    named.write_bytes(pickle.dumps({"step": 42, "v": "named"}))
    monkeypatch.setenv("HAI_LATEST_CHECKPOINT", str(named))
    checkpointer = Checkpointer(tmp_path / "dir")
    loaded = checkpointer.load_latest()
    assert loaded is not None and (loaded.step, loaded.state["v"], loaded.path) == (42, "named", named)

    # Once the job has checkpoints of its own, their known steps win over a file of another kind.
    checkpointer.save({"v": "dir"}, 7)
    loaded = checkpointer.load_latest()
    assert loaded is not None and (loaded.step, loaded.state) == (7, {"v": "dir"})


@pytest.mark.parametrize("problem", ["missing", "damaged"])
def test_unusable_latest_checkpoint_falls_back_to_the_directory(
    tmp_path: Path, problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpointer = Checkpointer(tmp_path / "dir")
    checkpointer.save({"v": "dir"}, 10)
    named = tmp_path / "checkpoint-00000099.pkl"
    if problem == "damaged":
        named.write_bytes(b"\x80\x05not a pickle")
    monkeypatch.setenv("HAI_LATEST_CHECKPOINT", str(named))
    loaded = checkpointer.load_latest()
    assert loaded is not None and (loaded.step, loaded.state) == (10, {"v": "dir"})
    assert str(named) in capsys.readouterr().err


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep=0"):
        Checkpointer(tmp_path, keep=0)
    with pytest.raises(ValueError, match="step=-1"):
        Checkpointer(tmp_path).save({}, -1)
