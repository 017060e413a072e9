"""How each backend hands a job its credential: a file (local, docker: the work dir's) or a Secret mounted
read-only (kubernetes), named by HAI_TOKEN_FILE; the token itself is in no environment and no pod spec."""

from __future__ import annotations

import base64
import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from hai_airflow.backends.common.base import JobEnvironment, Launch
from hai_airflow.backends.common.credential import write_credential
from hai_airflow.backends.common.jobuser import JobUser
from hai_airflow.backends.common.workerenv import worker_slots
from hai_airflow.backends.docker import containers as cfg
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.scheduling.model import WorkerPlacement
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec
from tests.backends.test_kube_manifests import SCHEMA_VERSIONS, needs_validator, validate

TOKEN = "job-credential-" + "x" * 32


def launch(tmp_path: Path, credential: str | None = TOKEN, spec: object = None) -> Launch:
    spec = spec or CpuJobSpec(task_name="prep", code_path="/nas/u/p", cmd="python3 prep.py")
    job = JobEnvironment(
        "alice", "vision", tmp_path / "model", server="http://hai:8765", credential=credential
    )
    return Launch(
        job_id=7, instance_id=42, spec=spec, placement=(), job=job,  # type: ignore[arg-type]
        log_path=tmp_path / "42" / "output.log", work_dir=tmp_path / "42",
    )  # fmt: skip


def test_the_launch_names_the_file_and_the_server_never_the_token(tmp_path: Path) -> None:
    it = launch(tmp_path)
    assert it.env["HAI_TOKEN_FILE"] == str(tmp_path / "42" / "hai-token")
    assert it.env["HAI_SERVER"] == "http://hai:8765"
    assert TOKEN not in repr(it) and TOKEN not in json.dumps(it.env)
    bare = launch(tmp_path, credential=None)
    assert "HAI_TOKEN_FILE" not in bare.env
    assert "HAI_SERVER" not in replace(bare, job=replace(bare.job, server=None)).env


def test_the_file_is_written_0600_for_the_jobs_account_and_not_through_a_link(tmp_path: Path) -> None:
    it = launch(tmp_path)
    it.work_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    it.credential_path.symlink_to(elsewhere)  # planted where the file goes: replaced, never followed
    me = JobUser("me", os.geteuid(), os.getegid(), ())
    write_credential(it, me, tmp_path)
    info = it.credential_path.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert it.credential_path.read_text() == TOKEN + "\n" and not elsewhere.exists()
    write_credential(launch(tmp_path, credential=None), me, tmp_path)  # nothing to write: nothing done


def test_a_docker_worker_gets_the_work_dirs_file_over_its_own_env(tmp_path: Path) -> None:
    it = launch(tmp_path)
    it = replace(it, spec=it.spec.model_copy(update={"env": {"HAI_TOKEN_FILE": "/mine"}}))
    account = JobUser("alice", 1000, 1000, ())
    kwargs = cfg.create_kwargs(
        it, worker_slots(((WorkerPlacement("docker", ())),))[0], cfg.DockerOptions(), account
    )
    assert kwargs["environment"]["HAI_TOKEN_FILE"] == str(it.credential_path)
    assert TOKEN not in json.dumps(kwargs, default=str)


def test_a_pod_mounts_its_secret_read_only_and_sees_only_its_path(tmp_path: Path) -> None:
    it = launch(tmp_path)
    pod = m.worker_pods(it, m.KubernetesOptions())[0]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HAI_TOKEN_FILE"] == m.CREDENTIAL_PATH == "/hai/credential/token"
    (mount,) = [v for v in container["volumeMounts"] if v["name"] == "hai-credential"]
    assert mount == {"name": "hai-credential", "mountPath": "/hai/credential", "readOnly": True}
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "hai-credential"]
    assert volume["secret"]["secretName"] == "hai-42-credential" and volume["secret"]["defaultMode"] == 0o444
    assert TOKEN not in json.dumps(pod)
    grouped = m.worker_pods(it, m.KubernetesOptions(fs_group=2000))[0]
    (volume,) = [v for v in grouped["spec"]["volumes"] if v["name"] == "hai-credential"]
    assert volume["secret"]["defaultMode"] == 0o440
    secret = m.credential_secret(it, m.KubernetesOptions())
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert secret["metadata"]["labels"][m.LABEL_INSTANCE] == "42"
    without = m.worker_pods(launch(tmp_path, credential=None), m.KubernetesOptions())[0]
    assert "hai-credential" not in json.dumps(without) and "HAI_TOKEN_FILE" not in json.dumps(without)


def test_an_mpijobs_pods_mount_it_too(tmp_path: Path) -> None:
    spec = DistributedJobSpec(
        task_name="hvd", code_path="/nas/u/p", cmd="python3 t.py", workers=2, worker_resource_pkg=2
    )
    it = replace(
        launch(tmp_path, spec=spec), placement=tuple(WorkerPlacement(f"n{i}", (0,)) for i in range(2))
    )
    job = m.mpijob(it, m.KubernetesOptions())
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        volumes = replica["template"]["spec"]["volumes"]
        assert any(v["name"] == "hai-credential" for v in volumes)
    assert TOKEN not in json.dumps(job)


def test_the_server_may_make_and_delete_the_secrets(tmp_path: Path) -> None:
    (role,) = [d for d in m.rbac("hai", {}) if d["kind"] == "Role"]
    (rule,) = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert rule["verbs"] == ["create", "delete"]  # never get or list: the namespace holds the server's own


@needs_validator
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_the_secret_and_its_pod_pass_strict_validation(tmp_path: Path, version: str) -> None:
    it = launch(tmp_path)
    opts = m.KubernetesOptions(fs_group=1000)
    docs = {"credential-pod": m.worker_pods(it, opts)[0], "credential-secret": m.credential_secret(it, opts)}
    done = validate(tmp_path, docs, version)
    assert done.returncode == 0, done.stdout + done.stderr
