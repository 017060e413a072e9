"""`[backend] unlisted_images = "refuse"` on the local backend: a job naming an image the server has
no environment for is refused at submit (422, exit 2, the field and the fix), and nothing is kept."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.cli import hai
from tests.support.live_cli import hai_ok
from tests.support.live_server import TEST_CONFIG, LiveServer, start_server

LISTED = "registry/listed:1"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A live server whose local backend refuses images it does not list (it lists one: the server's
    own Python environment)."""
    venv = Path(sys.executable).parent.parent
    config = TEST_CONFIG + f'\n[backend]\nunlisted_images = "refuse"\nimages = {{ "{LISTED}" = "{venv}" }}\n'
    with start_server(tmp_path_factory.mktemp("hai"), config) as live:
        yield live


def _tasks(server: LiveServer) -> list[dict[str, object]]:
    listed: list[dict[str, object]] = json.loads(hai_ok(server, "task", "--json"))
    return listed


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        pytest.param(["submit", "cpu", "--image=pytorch/pytorch:2.1.0"], "--image", id="submit --image"),
        pytest.param(["submit", "standalone", "--gpus=1", "--worker-image=pytorch/pytorch:2.1.0"],
                     "--image", id="submit standalone --worker-image"),
        pytest.param(["submit", "distributed", "--workers=2", "--gpus=1", "--image=" + LISTED,
                      "--worker-image=horovod/horovod:0.28"], "--worker-image",
                     id="distributed workers' image"),
    ],
)  # fmt: skip
def test_an_unlisted_image_is_refused_at_submit(server: LiveServer, tmp_path: Path, flags: list[str],
                                                flag: str) -> None:  # fmt: skip
    """The server's 422 names spec.image (or spec.worker_image); `hai` names it as the flag."""
    before = _tasks(server)
    done = hai(server, "alice", *flags, "--name=img", f"--code-dir={tmp_path}", f"{sys.executable} -c pass")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    message = " ".join(done.stderr.split())
    assert message.startswith("Error: "), message
    assert flag in message and "is not available" in message, message
    assert message.endswith(f"See `hai {' '.join(flags[:2])} --help`."), message
    assert "Leave out --image" in message and "[backend] images" in message, message
    assert "Traceback" not in done.stderr
    assert _tasks(server) == before, "a refused submit kept a task"


def test_a_listed_image_and_the_default_are_accepted(server: LiveServer, tmp_path: Path) -> None:
    for flags in ([f"--image={LISTED}"], []):
        out = hai_ok(server, "submit", "cpu", "--name=img", f"--code-dir={tmp_path}", "--wait", *flags,
                     f"{sys.executable} -c pass")  # fmt: skip
        task = int(out.split("created task ")[1].split()[0])
        shown = json.loads(hai_ok(server, "task", str(task), "-o", "json"))
        assert shown["state"] == "SUCCEEDED", shown
        # A listed image is used: no note says otherwise.
        assert not [e for e in shown["events"] if "is not used" in e["reason"]], shown["events"]
