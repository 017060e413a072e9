"""A task from a file (`hai create -f`, as `kubectl apply -f` and `sbatch job.sh`), the file `hai task N
-o yaml` prints for it, and one spelling of each flag on every job command (issue 40), against a live
server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hai_airflow.cli.jobkeys import field_key
from hai_airflow.cli.jobspec import SPEC_MODELS
from hai_airflow.vocabulary import FIELD_FLAGS
from tests.cli.conftest import Hai, json_out
from tests.cli.test_live import as_user, created_id
from tests.support.live_server import LiveServer

STANDALONE = """\
# a comment, as in any YAML file
mode: standalone
task_name: 训练 from a file
code_path: {code}
resource_pkg: 454
max_schedule: 4
cmd: echo "it ran"
env:
  LR: "0.1"
  "NO": "yes"
model_id: 31
"""

DISTRIBUTED = """\
mode: distributed
task_name: hvd
code_path: {code}
workers: 2
worker_resource_pkg: 454
worker_image: local
cmd: echo rank
"""

CPU = {"mode": "cpu", "task_name": "prep", "code_path": "{code}", "cpus": 2, "cmd": "echo prep"}


@pytest.fixture
def code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    return code


def stored_spec(hai: Hai, env: dict[str, str], job: int) -> dict[str, Any]:
    result = hai("task", str(job), "-o", "json", env=env)
    assert result.exit_code == 0, result.output
    spec: dict[str, Any] = json_out(result)["spec"]
    return spec


def create_from(hai: Hai, env: dict[str, str], *args: str, input: str | None = None) -> int:
    result = hai("create", *args, env=env, input=input)
    assert result.exit_code == 0, result.output
    return created_id(result.stdout)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        pytest.param("job.yaml", STANDALONE, {"resource_pkg": 454, "env": {"LR": "0.1", "NO": "yes"}}),
        pytest.param(
            "job.yaml", DISTRIBUTED, {"workers": 2, "worker_image": "local", "processes": "per-gpu"}
        ),
        pytest.param("job.json", json.dumps(CPU), {"cpus": 2.0}, id="cpu as JSON"),
    ],
)
def test_create_from_a_file_and_from_stdin_each_mode(
    hai: Hai, clean: LiveServer, code: Path, name: str, text: str, expected: dict[str, Any]
) -> None:
    alice = as_user(clean, "alice")
    path = code.parent / name
    path.write_text(text.replace("{code}", str(code)), encoding="utf-8")
    from_file = create_from(hai, alice, "-f", str(path))
    from_stdin = create_from(hai, alice, "-f", "-", input=path.read_text(encoding="utf-8"))
    spec = stored_spec(hai, alice, from_file)
    assert spec.items() >= expected.items() and spec["code_path"] == str(code)
    assert stored_spec(hai, alice, from_stdin) == spec


def test_task_yaml_is_a_job_file_that_creates_an_equal_task(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice = as_user(clean, "alice")
    first = create_from(hai, alice, "-f", "-", input=STANDALONE.format(code=code))
    printed = hai("task", str(first), "-o", "yaml", env=alice)
    assert printed.exit_code == 0, printed.output
    document = yaml.safe_load(printed.stdout)
    # Every field of the mode's model under its flag's name, and nothing of the job's state.
    fields = [field_key(f) for f in SPEC_MODELS["standalone"].model_fields if f != "mode"]
    assert list(document) == ["mode", *fields]
    again = create_from(hai, alice, "-f", "-", input=printed.stdout)
    assert again != first and stored_spec(hai, alice, again) == stored_spec(hai, alice, first)
    assert hai("task", str(first), "-o", "json", env=alice).stdout.lstrip().startswith("{")


def test_another_users_task_yaml_is_refused(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice = create_from(hai, as_user(clean, "alice"), "-f", "-", input=STANDALONE.format(code=code))
    for other in ("bob", "dave"):
        result = hai("task", str(alice), "-o", "yaml", env=as_user(clean, other))
        assert result.exit_code == 1, result.output
        assert result.stdout == "" and f"{alice} not found" in result.stderr
    assert "训练 from a file" in hai("task", str(alice), "-o", "yaml", env=as_user(clean, "carol")).stdout


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param(
            DISTRIBUTED.replace("workers: 2", "workers: 0"),
            "Error: job.yaml line 4: workers: input should be greater than or equal to 1.",
            id="a bad value names its field and line",
        ),
        pytest.param(
            STANDALONE.replace("max_schedule: 4", "priority: 4"),
            "Error: job.yaml line 6: priority is not a job-file key. The keys are `hai create`'s flags "
            "without the dashes (see `hai create --help`).",
            id="an unknown key is refused by name",
        ),
        pytest.param(
            STANDALONE.replace("resource_pkg:", "resource_pk:"),
            "Error: job.yaml: resource_pkg is required for a standalone task.\n"
            "Error: job.yaml line 5: resource_pk is not a job-file key. Did you mean resource_pkg?",
            id="a near miss gets a did you mean",
        ),
        pytest.param(
            STANDALONE.replace("max_schedule: 4", "time_limit_seconds: 600"),
            "Error: job.yaml line 6: time_limit_seconds is not a job-file key. Did you mean time_limit?",
            id="the API's name points to the flag's",
        ),
        pytest.param(
            STANDALONE.replace("max_schedule: 4", "time-limit: 600"),
            "Error: job.yaml line 6: time-limit: '600' has no unit: write 600m for minutes or 600s for "
            "seconds.",
            id="a value is read as its flag reads it",
        ),
        pytest.param(
            STANDALONE.replace("max_schedule: 4", "cpus: 2"),
            "Error: job.yaml line 6: cpus is not valid for a standalone task: only a cpu task takes it. "
            "Leave out cpus, or make the task cpu (mode cpu).",
            id="a key of another mode",
        ),
        pytest.param(
            STANDALONE.replace("mode: standalone\n", ""),
            "Error: job.yaml: mode is required; it must be one of cpu, standalone, distributed.",
            id="mode is required",
        ),
        pytest.param(
            STANDALONE + "cmd: again\n",
            "Error: job.yaml line 12: cmd is given twice (first on line 7).",
            id="a field given twice",
        ),
        pytest.param(
            "mode: cpu\ncmd: [echo\n",
            "Error: job.yaml line 3: while parsing a flow sequence expected ',' or ']'",
            id="not YAML",
        ),
        pytest.param(
            "- mode: cpu\n", "Error: job.yaml holds a list; a job file maps `hai create`'s flags", id="a list"
        ),
        pytest.param(
            "!!python/object/apply:os.system [echo hi]\n",
            "Error: job.yaml line 1: could not determine a constructor for the tag",
            id="safe loading only",
        ),
    ],
)
def test_a_bad_file_exits_2_naming_the_line_and_creates_nothing(
    hai: Hai, clean: LiveServer, code: Path, text: str, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = as_user(clean, "alice")
    monkeypatch.chdir(code.parent)
    Path("job.yaml").write_text(text.replace("{code}", str(code)), encoding="utf-8")
    before = json_out(hai("task", "--json", env=alice))
    result = hai("create", "-f", "job.yaml", env=alice)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(error) and result.stdout == ""
    assert json_out(hai("task", "--json", env=alice)) == before


def test_every_problem_of_a_file_is_named(hai: Hai, clean: LiveServer, code: Path) -> None:
    text = STANDALONE.format(code=code).replace("resource_pkg: 454", "resource_pkg: -1")
    result = hai("create", "-f", "-", "--server", clean.url, input=text + "shm: 0\n")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "Error: <stdin> line 5: resource_pkg: input should be greater than or equal to 0.",
        "Error: <stdin> line 12: shm: input should be greater than 0.",
    ]


def test_job_flags_beside_a_file_are_refused(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice = as_user(clean, "alice")
    job = STANDALONE.format(code=code)
    mixed = hai("create", "-f", "-", "--task-name=other", "--max-schedule=0", env=alice, input=job)
    assert mixed.exit_code == 2, mixed.output
    assert mixed.stderr == (
        "Error: --task-name, --max-schedule cannot be given with -f: the job file holds the whole task. "
        "Put them in the file, or leave out -f.\n"
    )
    # How to submit and how to print the result are not part of the task.
    waited = hai(
        "create", "-f", "-", "--client-key=k1", "--wait", "--server", clean.url, env=alice, input=job
    )
    assert waited.exit_code == 0, waited.output
    assert waited.stdout.splitlines()[-1].endswith("SUCCEEDED")


@pytest.mark.parametrize(
    "words",
    [
        pytest.param(("--task-name=n", "--code-path={code}", "--image=img:1"), id="create's spelling"),
        pytest.param(("--name=n", "--code-dir={code}", "--worker-image=img:1"), id="submit's spelling"),
    ],
)
def test_either_spelling_works_on_either_command(
    hai: Hai, clean: LiveServer, code: Path, words: tuple[str, ...]
) -> None:
    alice = as_user(clean, "alice")
    flags = [w.format(code=code) for w in words]
    by_create = create_from(hai, alice, *flags, "--resource-pkg=454", "--gpu-type=V100", "--cmd=echo hi")
    submitted = hai("submit", "standalone", *flags, "--gpus=1", "echo hi", env=alice)
    assert submitted.exit_code == 0, submitted.output
    by_submit = created_id(submitted.stdout)
    assert stored_spec(hai, alice, by_create) == stored_spec(hai, alice, by_submit)
    cpu = hai("submit", "cpu", *flags, "echo hi", env=alice)
    assert cpu.exit_code == 0, cpu.output
    spec = stored_spec(hai, alice, created_id(cpu.stdout))
    assert (spec["task_name"], spec["code_path"], spec["image"]) == ("n", str(code), "img:1")
    for command in (("create",), ("submit", "standalone"), ("submit", "distributed"), ("submit", "cpu")):
        shown = hai(*command, "--help").stdout
        assert "--task-name TEXT" in shown and "--code-path TEXT" in shown and "--image TEXT" in shown
        assert "--name TEXT" not in shown and "--code-dir TEXT" not in shown, command


FLAG_NAMES = """\
mode: standalone
task-name: keys as flags
code_path: {code}
resource-pkg: 454
time_limit: 10m
cmd: echo hi
array: 0-3%2
grace: 30
label: [team=vision]
env:
  LR: "0.1"
"""


def test_a_job_file_takes_the_flags_names_and_values(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice = as_user(clean, "alice")
    first = create_from(hai, alice, "-f", "-", input=FLAG_NAMES.format(code=code))
    tasks = json_out(hai("task", "--array", str(first), "--json", env=alice))
    assert len(tasks) == 4
    spec = stored_spec(hai, alice, first)
    assert spec["time_limit_seconds"] == 600 and spec["grace_seconds"] == 30
    assert spec["labels"] == {"team": "vision"} and spec["task_name"] == "keys as flags"
    printed = hai("task", str(first), "-o", "yaml", env=alice)
    assert 'time_limit: "10m"' in printed.stdout.splitlines() and "time_limit_seconds" not in printed.stdout
    again = create_from(hai, alice, "-f", "-", input=printed.stdout)
    assert stored_spec(hai, alice, again) == spec


def test_create_takes_mode_cpu_as_a_job_file_does(hai: Hai, clean: LiveServer, code: Path) -> None:
    alice = as_user(clean, "alice")
    by_flags = create_from(
        hai, alice, "--mode=cpu", "--task-name=prep", f"--code-path={code}", "--cpus=2", "--memory=3",
        "--cmd=echo prep",
    )  # fmt: skip
    text = f"mode: cpu\ntask_name: prep\ncode_path: {code}\ncpus: 2\nmemory: 3\ncmd: echo prep\n"
    by_file = create_from(hai, alice, "-f", "-", input=text)
    short = hai(
        "submit", "cpu", "--name=prep", f"--code-dir={code}", "--cpus=2", "--memory=3", "echo prep", env=alice
    )
    assert short.exit_code == 0, short.output
    spec = stored_spec(hai, alice, by_flags)
    assert (spec["mode"], spec["cpus"], spec["memory_gb"]) == ("cpu", 2, 3)
    assert stored_spec(hai, alice, by_file) == spec == stored_spec(hai, alice, created_id(short.stdout))
    refused = hai("create", "--task-name=x", f"--code-path={code}", "--resource-pkg=454", "--cpus=2",
                  "--cmd=true", env=alice)  # fmt: skip
    assert refused.exit_code == 2
    assert refused.stderr.startswith("Error: --cpus is not valid for a standalone task: only a cpu task")


def test_the_downloadable_hai_carries_the_job_file_keys() -> None:
    """The downloaded `hai`'s `vocabulary` holds FIELD_FLAGS itself, so its `create` names the same flags."""
    from hai_airflow.server.api.routes.cli_download import vocabulary_source

    served: dict[str, object] = {}
    exec(compile(vocabulary_source(), "vocabulary", "exec"), served)
    assert served["FIELD_FLAGS"] == FIELD_FLAGS
