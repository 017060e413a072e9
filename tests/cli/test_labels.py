"""Labels through the real CLI against a live server: `--label` on every submit path, `hai task -l`
selecting by them (kubectl's four kinds of requirement), within what the caller may list."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id
from tests.support.live_server import LiveServer


def submit(hai: Hai, server: LiveServer, user: str, code: Path, *labels: str) -> int:
    flags = [f"--label={label}" for label in labels]
    made = hai("submit", "cpu", "--name=l", f"--code-dir={code}", *flags, "true", env=as_user(server, user))
    assert made.exit_code == 0, made.output
    return created_id(made.stdout)


def selected(hai: Hai, server: LiveServer, user: str, selector: str, *extra: str) -> list[int]:
    listed = hai("task", "-l", selector, "-o", "json", *extra, env=as_user(server, user))
    assert listed.exit_code == 0, listed.output
    return sorted(j["id"] for j in json_out(listed))


def test_tasks_are_selected_by_their_labels(hai: Hai, live_server: LiveServer, tmp_path: Path) -> None:
    train = submit(hai, live_server, "alice", tmp_path, "team=vision", "stage=train", "gpu=v100")
    evaluate = submit(hai, live_server, "alice", tmp_path, "team=vision", "stage=eval")
    other = submit(hai, live_server, "alice", tmp_path, "team=vision_x")  # `_` is no LIKE wildcard here
    bare = submit(hai, live_server, "alice", tmp_path)
    assert selected(hai, live_server, "alice", "team=vision") == [train, evaluate]
    assert selected(hai, live_server, "alice", "team=vision,stage!=eval") == [train]
    assert selected(hai, live_server, "alice", "gpu") == [train]
    mine = selected(hai, live_server, "alice", "!team")
    assert bare in mine and not {train, evaluate, other} & set(mine)
    assert selected(hai, live_server, "alice", "stage!=eval") == sorted(
        set(selected(hai, live_server, "alice", "!nothing")) - {evaluate}
    )
    shown = hai("task", str(train), env=as_user(live_server, "alice")).stdout
    assert any(line.split()[:1] == ["labels"] and "gpu=v100, stage=train, team=vision" in line
               for line in shown.splitlines()), shown  # fmt: skip

    # Selection stays within what each may list: dave sees none of alice's, carol (vision's admin) all.
    assert selected(hai, live_server, "dave", "team=vision", "--all") == []
    assert selected(hai, live_server, "carol", "team=vision", "--all") == [train, evaluate]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("submit", "cpu", "--name=x", "--label=team", "true"), "--label: label 'team' is not key=value"),
        (("submit", "cpu", "--name=x", "--label=a b=c", "true"), "--label: label key 'a b' is not"),
        (("task", "-l", "team=%"), "a selector is key=value, key!=value, key or !key"),
    ],
)
def test_bad_labels_and_selectors_are_usage_errors(
    hai: Hai, live_server: LiveServer, tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    extra = (f"--code-dir={tmp_path}",) if args[0] == "submit" else ()
    refused = hai(*args[:3], *extra, *args[3:], env=as_user(live_server, "alice"))
    assert refused.exit_code == 2 and says in refused.stderr, refused.output
