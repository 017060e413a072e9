"""`--after` and `--after-any` through the real CLI against a live server, as Slurm users write
`--dependency=afterok:N`: the dependent waits (and `hai queue` says for what), then runs; one after
a failure is cancelled with the reason; bad ids are usage errors."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, wait_for
from tests.support.live_server import LiveServer


def submit(hai: Hai, server: LiveServer, code: Path, cmd: str, *extra: str) -> int:
    alice = as_user(server, "alice")
    made = hai("submit", "cpu", "--name=step", f"--code-dir={code}", *extra, cmd, env=alice)
    assert made.exit_code == 0, made.output
    return created_id(made.stdout)


def test_after_waits_then_runs_and_after_a_failure_cancels(
    hai: Hai, live_server: LiveServer, tmp_path: Path
) -> None:
    alice = as_user(live_server, "alice")
    first = submit(hai, live_server, tmp_path, "sleep 3")
    second = submit(hai, live_server, tmp_path, "true", f"--after={first}")
    queue = hai("queue", "-o", "json", env=alice)
    reasons = {e["job"]["id"]: e["reason"] for e in json_out(queue)}
    assert reasons[second] == f"waiting for task {first} to succeed (--after)"
    waited = hai("wait", str(second), "--timeout=60", env=alice)
    assert waited.exit_code == 0 and f"task {second} SUCCEEDED" in waited.stdout, waited.output

    failing = submit(hai, live_server, tmp_path, "sleep 2; exit 3")
    doomed = submit(hai, live_server, tmp_path, "true", f"--after={failing},{second}")
    anyway = submit(hai, live_server, tmp_path, "true", f"--after-any={failing}")
    ended = hai("wait", str(doomed), "--timeout=60", env=alice)
    assert ended.exit_code == 1, ended.output
    why = f"task {failing} ended FAILED, so its --after can never be met"
    assert f"task {doomed} CANCELLED ({why})" in ended.stdout
    wait_for(live_server, anyway, {"SUCCEEDED"})


def test_bad_or_unseen_dependencies_are_refused_before_anything_is_stored(
    hai: Hai, live_server: LiveServer, tmp_path: Path
) -> None:
    alice, dave = as_user(live_server, "alice"), as_user(live_server, "dave")
    before = json_out(hai("task", "--all", "-o", "json", env=alice))
    bad = hai("submit", "cpu", "--name=x", f"--code-dir={tmp_path}", "--after=first", "true", env=alice)
    assert bad.exit_code == 2 and "--after must be comma-separated ids, e.g. 12,13" in bad.stderr, bad.output
    made = hai("submit", "cpu", "--name=d", f"--code-dir={tmp_path}", "true", env=dave)
    theirs = created_id(made.stdout)
    unseen = hai(
        "submit", "cpu", "--name=x", f"--code-dir={tmp_path}", f"--after={theirs}", "true", env=alice
    )  # fmt: skip
    assert unseen.exit_code == 2 and f"after: task {theirs} not found" in unseen.stderr, unseen.output
    assert json_out(hai("task", "--all", "-o", "json", env=alice)) == before
