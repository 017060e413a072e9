"""`--array` through the real CLI against a live server, as Slurm users write it: every task made,
`--wait` waits for them all, `hai task --array` lists them, `hai cancel` of the array's id stops them."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id, wait_for
from tests.support.live_server import LiveServer


def test_an_array_runs_every_index_and_its_id_cancels_the_rest(
    hai: Hai, live_server: LiveServer, tmp_path: Path
) -> None:
    alice = as_user(live_server, "alice")
    made = hai(
        "submit", "cpu", "--name=sweep", f"--code-dir={tmp_path}", "--array=0-3%2", "--wait",
        'echo "index $HAI_ARRAY_INDEX of $HAI_ARRAY_ID"', env=alice,
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    first = int(made.stdout.split()[2])
    said = f"array {first}: 4 tasks (indices 0-3), at most 2 at once, tasks {first}-{first + 3}"
    assert said in made.stderr
    assert [f"task {first + i} SUCCEEDED" in made.stdout for i in range(4)] == [True] * 4
    listed = json_out(hai("task", "--array", str(first), "-o", "json", env=alice))
    assert sorted(t["array_index"] for t in listed) == [0, 1, 2, 3]
    logs = [hai("log", str(first + i), env=alice).stdout for i in range(4)]
    assert logs == [f"index {i} of {first}\n" for i in range(4)]

    long = hai(
        "submit", "cpu", "--name=long", f"--code-dir={tmp_path}", "--array=0-5%1", "sleep 60", env=alice
    )  # fmt: skip
    head = created_id(long.stdout)
    wait_for(live_server, head, {"RUNNING"})
    cancelled = hai("cancel", str(head), env=alice)
    assert cancelled.exit_code == 0 and f"cancelling array {head}" in cancelled.stdout, cancelled.output
    for i in range(6):
        wait_for(live_server, head + i, {"CANCELLED"})


def test_a_bad_array_is_a_usage_error_and_nothing_is_made(
    hai: Hai, live_server: LiveServer, tmp_path: Path
) -> None:
    alice = as_user(live_server, "alice")
    before = json_out(hai("task", "--all", "-o", "json", env=alice))
    bad = hai("submit", "cpu", "--name=x", f"--code-dir={tmp_path}", "--array=9-0", "true", env=alice)
    assert bad.exit_code == 2 and "'9-0' is not a range from low to high" in bad.stderr, bad.output
    assert json_out(hai("task", "--all", "-o", "json", env=alice)) == before
