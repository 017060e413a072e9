"""Table tests of spec validation: each bad value fails, and the error names the field at fault."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from hai_airflow.spec import (
    MAX_CMD_BYTES,
    MAX_ENV_BYTES,
    MAX_ENV_VARS,
    MAX_IMAGE_CHARS,
    MAX_PROJECT_STORAGES,
    NUL_OR_BLANK,
    STORE_INT_MAX,
    CpuJobSpec,
    DistributedJobSpec,
    GroupConfig,
    JobView,
    NodeConfig,
    OtherJobView,
    StandaloneJobSpec,
    SubmitRequest,
    UserConfig,
    priority_class,
)

BASE: dict[str, Any] = {"task_name": "resnet", "code_path": "/nas/u/resnet", "cmd": "python3 train.py"}
STANDALONE: dict[str, Any] = {**BASE, "mode": "standalone", "resource_pkg": 1}
DISTRIBUTED: dict[str, Any] = {**BASE, "mode": "distributed", "workers": 2, "worker_resource_pkg": 1}


def submit(**spec: Any) -> SubmitRequest:
    return SubmitRequest.model_validate({"spec": spec})


@pytest.mark.parametrize(
    ("model", "payload", "field", "message"),
    [
        pytest.param(CpuJobSpec, {**BASE, "task_name": ""}, "task_name", "at least 1 character",
                     id="empty task name"),
        pytest.param(CpuJobSpec, {**BASE, "task_name": "   "}, "task_name", "must not be blank",
                     id="blank task name"),
        pytest.param(CpuJobSpec, {**BASE, "cmd": " "}, "cmd", "must not be blank", id="blank command"),
        pytest.param(CpuJobSpec, {**BASE, "code_path": ""}, "code_path", "at least 1 character",
                     id="empty code path"),
        pytest.param(CpuJobSpec, {**BASE, "max_schedule": 5}, "max_schedule", "one of 0|4|6|8|24|48",
                     id="max_schedule not a documented choice"),
        pytest.param(CpuJobSpec, {**BASE, "max_schedule": -4}, "max_schedule", "one of 0|4|6|8|24|48",
                     id="negative max_schedule"),
        pytest.param(CpuJobSpec, {**BASE, "code_src": "svn"}, "code_src", "'nas' or 'git'",
                     id="unknown code source"),
        pytest.param(CpuJobSpec, {**BASE, "git_branch": "main"}, "git_branch", "only valid when",
                     id="git branch without git"),
        pytest.param(CpuJobSpec, {**BASE, "project_storage": "10111,abc"}, "project_storage",
                     "comma-separated ids, e.g. 10111,10222", id="storage ids not numbers"),
        pytest.param(CpuJobSpec, {**BASE, "project_storage": "10111,-2"}, "project_storage",
                     "greater than or equal", id="negative storage id"),
        pytest.param(CpuJobSpec, {**BASE, "shm": 0}, "shm", "greater than 0", id="zero shared memory"),
        pytest.param(CpuJobSpec, {**BASE, "grace_seconds": 7200}, "grace_seconds", "less than or equal",
                     id="grace period over an hour"),
        pytest.param(CpuJobSpec, {**BASE, "env": {"MY VAR": "1"}}, "env", "env names", id="bad env name"),
        pytest.param(CpuJobSpec, {**BASE, "env": {"1X": "1"}}, "env", "env names",
                     id="env name starting with a digit"),
        pytest.param(CpuJobSpec, {**BASE, "cpus": 0}, "cpus", "greater than 0", id="zero CPUs"),
        pytest.param(CpuJobSpec, {**BASE, "memory_gb": -1}, "memory_gb", "greater than or equal",
                     id="negative memory"),
        pytest.param(CpuJobSpec, {**BASE, "gpus": 1}, "gpus", "Extra inputs", id="unknown field"),
        pytest.param(CpuJobSpec, {**BASE, "model_id": -1}, "model_id", "greater than or equal",
                     id="negative model id"),
        pytest.param(StandaloneJobSpec, {**BASE, "mode": "standalone"}, "resource_pkg", "Field required",
                     id="standalone without a resource package"),
        pytest.param(DistributedJobSpec, {**DISTRIBUTED, "workers": 0}, "workers", "greater than or equal",
                     id="zero workers"),
        pytest.param(DistributedJobSpec, {**DISTRIBUTED, "workers": 4096}, "workers", "less than or equal",
                     id="too many workers"),
        pytest.param(DistributedJobSpec, {**BASE, "mode": "distributed", "workers": 2},
                     "worker_resource_pkg", "Field required", id="distributed without a worker package"),
        pytest.param(SubmitRequest, {"spec": BASE}, "mode", "discriminator 'mode'",
                     id="spec without a mode"),
        pytest.param(SubmitRequest, {"spec": {**BASE, "mode": "gpu"}}, "mode", "'cpu', 'standalone'",
                     id="unknown mode"),
        pytest.param(SubmitRequest, {"spec": STANDALONE, "client_key": "k" * 251}, "client_key",
                     "at most 250", id="idempotency key too long"),
        pytest.param(NodeConfig, {"name": "n1", "gpus": 65}, "gpus", "less than or equal",
                     id="node with more than 64 GPUs"),
        pytest.param(NodeConfig, {"name": ""}, "name", "at least 1 character", id="node without a name"),
        pytest.param(GroupConfig, {"name": "vision", "quota_gpus": -8}, "quota_gpus", "greater than or equal",
                     id="negative group quota"),
        pytest.param(UserConfig, {"name": "alice", "role": "root"}, "role", "'user', 'group_admin'",
                     id="unknown role"),
    ],
)
def test_bad_value_names_the_field(model: type[BaseModel], payload: dict[str, Any], field: str,
                                   message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(payload)
    errors = caught.value.errors()
    assert len(errors) == 1, errors
    where = [str(part) for part in errors[0]["loc"]]
    assert field in where or field in errors[0]["msg"], errors[0]
    assert message in errors[0]["msg"], errors[0]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param({**BASE, "project_storage": "10111, 10222"}, {"project_storage": (10111, 10222)},
                     id="storage ids from the CLI's comma form"),
        pytest.param({**BASE, "elastic": True}, {"effective_grace_seconds": 60},
                     id="elastic jobs get a 60 s save notice by default"),
        pytest.param({**BASE, "max_schedule": 24}, {"priority": "high"}, id="max_schedule > 0 is high"),
        pytest.param({**BASE, "env": {"_HAI_X1": "1"}, "code_src": "git", "git_branch": "dev"},
                     {"git_branch": "dev", "env": {"_HAI_X1": "1"}}, id="git branch and env accepted"),
    ],
)
def test_good_values_parse(payload: dict[str, Any], expected: dict[str, Any]) -> None:
    spec = CpuJobSpec.model_validate(payload)
    assert {k: getattr(spec, k) for k in expected} == expected


def test_modes_are_discriminated_and_specs_frozen() -> None:
    req = submit(**DISTRIBUTED)
    assert isinstance(req.spec, DistributedJobSpec)
    assert req.spec.workers == 2
    with pytest.raises(ValidationError, match="frozen"):
        req.spec.workers = 3  # type: ignore[misc]
    assert [priority_class(h) for h in (0, 4)] == ["low", "high"]


# ---- input limits ----------------------------------------------------------------------------------


def _first_error(payload: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        CpuJobSpec.model_validate(payload)
    err = caught.value.errors()[0]
    return ".".join(str(p) for p in err["loc"]), err["msg"]


@pytest.mark.parametrize(
    ("fields", "where", "message"),
    [
        pytest.param({"cmd": "x" * MAX_CMD_BYTES + "y"}, "cmd", "131,072 bytes", id="cmd one byte over"),
        pytest.param({"cmd": "é" * (MAX_CMD_BYTES // 2 + 1)}, "cmd", "131,072 bytes",
                     id="cmd counted in UTF-8 bytes, not characters"),
        pytest.param({"cmd": "echo\x00"}, "cmd", "NUL", id="NUL in cmd"),
        pytest.param({"task_name": "a\x00"}, "task_name", "NUL", id="NUL in the task name"),
        pytest.param({"code_path": "/x\x00"}, "code_path", "NUL", id="NUL in the code path"),
        pytest.param({"env": {"A": "\x00"}}, "env.A", "NUL", id="NUL in an env value"),
        pytest.param({"env": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}}, "env", "at most 256 items",
                     id="too many env variables"),
        pytest.param({"env": {"A": "x" * 70_000, "B": "x" * 70_000}}, "env", "at most 131,072",
                     id="env over its total size"),
        pytest.param({"cmd": "\t\n \r"}, "cmd", "blank", id="command of white space"),
        pytest.param({"model_id": STORE_INT_MAX + 1}, "model_id", "less than or equal",
                     id="model id past the store's INTEGER"),
        pytest.param({"project_storage": [0, 2**64]}, "project_storage.1", "less than or equal",
                     id="storage id past the store's INTEGER"),
        pytest.param({"max_schedule": "5"}, "max_schedule", "one of 0|4|6|8|24|48",
                     id="max_schedule text that is no choice"),
        pytest.param({"image": "x" * (MAX_IMAGE_CHARS + 1)}, "image", "at most 512",
                     id="image reference too long"),
    ],
)
def test_limits_refuse_naming_the_field(fields: dict[str, Any], where: str, message: str) -> None:
    loc, msg = _first_error({**BASE, **fields})
    assert loc == where and message in msg, (loc, msg)


def test_limits_admit_what_fits_exactly() -> None:
    spec = CpuJobSpec.model_validate(
        {**BASE, "cmd": "x" * MAX_CMD_BYTES, "env": {"A": "x" * (MAX_ENV_BYTES - 4)}, "max_schedule": "24"}
    )
    # `A=` + value + NUL is exactly MAX_ENV_BYTES; "24" is a rendered Airflow template, not JSON.
    assert len(spec.cmd.encode()) == MAX_CMD_BYTES and spec.max_schedule == 24


def test_json_is_validated_without_coercion_in_strict_mode() -> None:
    body = {"spec": {**BASE, "mode": "cpu", "max_schedule": "24"}}
    with pytest.raises(ValidationError, match="max_schedule must be one of"):
        SubmitRequest.model_validate_json(json.dumps(body), strict=True)
    body = {"spec": {**BASE, "mode": "cpu", "project_storage": [10111], "max_schedule": 24}}
    assert SubmitRequest.model_validate_json(json.dumps(body), strict=True).spec.max_schedule == 24


def test_the_json_schema_states_the_limits() -> None:
    defs = SubmitRequest.model_json_schema()["$defs"]
    spec = defs["StandaloneJobSpec"]
    props = spec["properties"]
    assert "mode" in spec["required"]
    assert spec["then"]["properties"]["code_src"] == {"const": "git"}
    assert props["max_schedule"]["enum"] == [0, 4, 6, 8, 24, 48]
    assert props["cmd"]["maxLength"] == MAX_CMD_BYTES and props["cmd"]["not"] == {"pattern": NUL_OR_BLANK}
    assert props["model_id"]["anyOf"][0]["maximum"] == STORE_INT_MAX
    assert props["resource_pkg"]["maximum"] == STORE_INT_MAX
    assert props["env"]["maxProperties"] == MAX_ENV_VARS
    assert props["env"]["propertyNames"]["pattern"] == "^[A-Za-z_][A-Za-z0-9_]*$"
    assert props["project_storage"]["maxItems"] == MAX_PROJECT_STORAGES


# ---- resizable distributed jobs (min_workers) ---------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param(
            {**DISTRIBUTED, "min_workers": 3},
            "`min_workers` (3) is more than `workers` (2)",
            id="more than it asks for",
        ),
        pytest.param({**DISTRIBUTED, "min_workers": 0}, "greater than or equal to 1", id="zero"),
        pytest.param(
            {**DISTRIBUTED, "min_workers": 1, "elastic": False},
            "`elastic` is false",
            id="told not to save on the notice",
        ),
        pytest.param(
            {**STANDALONE, "min_workers": 1},
            "Extra inputs are not permitted",
            id="a standalone job never resizes",
        ),
        pytest.param(
            {**BASE, "mode": "cpu", "min_workers": 1},
            "Extra inputs are not permitted",
            id="nor does a CPU job",
        ),
    ],
)
def test_min_workers_refusals_name_the_field(payload: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        submit(**payload)
    (error,) = caught.value.errors()
    assert "min_workers" in [str(p) for p in error["loc"]] or "min_workers" in error["msg"], error
    assert message in error["msg"], error


@pytest.mark.parametrize(
    ("min_workers", "resizable"),
    [pytest.param(1, True, id="below workers"), pytest.param(2, False, id="equal to workers: never shrinks")],
)
def test_min_workers_implies_elastic(min_workers: int, resizable: bool) -> None:
    spec = DistributedJobSpec.model_validate({**DISTRIBUTED, "min_workers": min_workers})
    assert (spec.elastic, spec.resizable, spec.effective_grace_seconds) == (True, resizable, 60)


SHAPE: dict[str, Any] = {
    "id": 7, "mode": "distributed", "state": "RUNNING", "priority": "low", "max_schedule": 0, "gpus": 32,
    "gpu_type": "V100", "workers": 4, "submitted_at": "2026-12-01T00:00:00Z",
}  # fmt: skip


def test_a_view_without_size_runs_at_all_it_asked_for() -> None:
    view = OtherJobView.model_validate(SHAPE)
    assert (view.size, view.min_workers, view.resized) == (4, None, False)


def test_another_users_job_shows_its_size_but_not_its_spec() -> None:
    full = JobView.model_validate(
        {**SHAPE, "min_workers": 2, "size": 2, "task_name": "secret", "user": "alice", "group": "vision",
         "spec": {**DISTRIBUTED, "workers": 4, "min_workers": 2}}
    )  # fmt: skip
    shown = OtherJobView.model_validate(full.model_dump(exclude={"visibility"}))
    dumped = shown.model_dump(mode="json")
    assert (dumped["size"], dumped["min_workers"], shown.resized) == (2, 2, True)
    assert not {"spec", "task_name", "user", "group"} & set(dumped)
    assert "secret" not in json.dumps(dumped)
