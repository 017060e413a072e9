"""Every object the kubernetes backend sends validates strictly against Kubernetes' own schemas."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hai_airflow.backends.common.base import JobEnvironment, Launch, StartError
from hai_airflow.backends.common.confine import PathRules
from hai_airflow.backends.common.jobuser import JobUser
from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.backends.kubernetes.pods import dropped_fields, mpijob_end
from hai_airflow.scheduling.model import WorkerPlacement
from hai_airflow.spec import CpuJobSpec, DistributedJobSpec, StandaloneJobSpec

VENV_VALIDATOR = Path(__file__).parents[2] / ".venv" / "bin" / "kubernetes-validate"
VALIDATOR = shutil.which("kubernetes-validate") or str(VENV_VALIDATOR)
SCHEMA_VERSIONS = ("1.25.0", "1.37.0")
"""The oldest and newest Kubernetes releases the validator knows."""
MODEL_DIR = "/nas/hai/jobs/7/model"
"""Where the server put job 7's model dir: in its own directory of $HAI_HOME on the NAS."""


def launch(spec: Any, placement: tuple[WorkerPlacement, ...], **kw: Any) -> Launch:
    return Launch(
        job_id=7, instance_id=42, spec=spec, placement=placement,
        job=JobEnvironment(user="alice", group="vision", model_dir=Path(MODEL_DIR)),
        log_path=Path("/hai/42/output.log"), work_dir=Path("/hai/42"), **kw,
    )  # fmt: skip


def standalone(**kw: Any) -> Launch:
    spec = StandaloneJobSpec(
        task_name="训练", code_path="/nas/u/proj", cmd="python3 train.py", resource_pkg=1, shm=1024,
        project_storage=(10111, 10222), elastic=True, gpu_type="A100", **kw,
    )  # fmt: skip
    placement = (WorkerPlacement("node-a", (0, 1, 2, 3), cpus=16, memory_gb=128),)
    return launch(spec, placement, storages={10111: "pvc-10111", 10222: "pvc-10222"})


def distributed() -> Launch:
    spec = DistributedJobSpec(
        task_name="hvd", code_src="git", code_path="https://git.example.com/x.git", git_branch="main",
        cmd="python3 train_hvd.py", workers=2, worker_resource_pkg=2, worker_image="img/w:1",
    )  # fmt: skip
    placement = tuple(WorkerPlacement(f"node-{i}", tuple(range(8)), cpus=64, memory_gb=512) for i in range(2))
    return launch(spec, placement)


def as_pod_template(name: str, template: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def every_manifest() -> dict[str, dict[str, Any]]:
    opts = m.KubernetesOptions(
        namespace="hai", nas_pvc="nas", image_pull_secrets=("regcred",), run_as_user=1000, run_as_group=1000,
        run_as_non_root=True, fs_group=1000,
    )  # fmt: skip
    pinned = m.KubernetesOptions(pin="node_name", service_account="hai-jobs")
    cpu = launch(CpuJobSpec(task_name="prep", code_path="/nas/p", cmd="python3 prep.py"), ())
    docs: dict[str, dict[str, Any]] = {
        "standalone-pod": m.worker_pods(standalone(), opts)[0],
        "standalone-pod-node-name": m.worker_pods(standalone(), pinned)[0],
        "cpu-pod": m.worker_pods(cpu, opts)[0],
        "gang-service": m.gang_service(distributed(), opts),
    }
    for i, pod in enumerate(m.worker_pods(distributed(), opts)):
        docs[f"gang-pod-{i}"] = pod
    host = m.KubernetesOptions(network="host", host_iface="ens5")
    docs["host-network-gang-pod"] = m.worker_pods(distributed(), host, "10.0.0.7")[1]
    by_ip = m.KubernetesOptions(gang_address="pod_ip")
    docs["pod-ip-gang-pod-0"] = m.worker_pods(distributed(), by_ip)[0]
    docs["pod-ip-gang-pod-1"] = m.worker_pods(distributed(), by_ip, "198.18.0.7")[1]
    job = m.mpijob(distributed(), opts)
    # The MPIJob CRD's schema is not Kubernetes'; each replica's template is a core PodTemplate.
    for role, replica in job["spec"]["mpiReplicaSpecs"].items():
        docs[f"mpijob-{role.lower()}"] = as_pod_template(f"mpijob-{role.lower()}", replica["template"])
    subject = {"kind": "ServiceAccount", "name": "hai", "namespace": "hai"}
    for doc in m.rbac("hai", subject):
        docs[f"rbac-{doc['kind'].lower()}"] = doc
    return docs


Docs = dict[str, dict[str, Any]]


def validate(tmp_path: Path, docs: Docs, version: str) -> subprocess.CompletedProcess[str]:
    files = []
    for name, doc in docs.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(json.dumps(doc))  # JSON is YAML
        files.append(str(path))
    return subprocess.run(
        [VALIDATOR, "--strict", "-k", version, *files], capture_output=True, text=True, timeout=120
    )


needs_validator = pytest.mark.skipif(
    not Path(VALIDATOR).exists(), reason="kubernetes-validate is not installed (dev extra)"
)


@needs_validator
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_manifest_passes_strict_validation(tmp_path: Path, version: str) -> None:
    docs = every_manifest()
    done = validate(tmp_path, docs, version)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" passed for resource ") == len(docs)


@needs_validator
def test_strict_validation_would_catch_a_misspelt_field(tmp_path: Path) -> None:
    pod = m.worker_pods(standalone(), m.KubernetesOptions())[0]
    pod["spec"]["containers"][0]["workDir"] = "/nas"
    done = validate(tmp_path, {"bad": pod}, SCHEMA_VERSIONS[-1])
    assert done.returncode != 0 and "workDir" in done.stdout + done.stderr


def test_rbac_yaml_is_the_rbac_rules_for_a_service_account() -> None:
    text = m.rbac_yaml("ml", "hai-sa")
    docs = [json.loads(part) for part in text.split("---\n") if part.strip()]
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"]
    assert docs[1]["subjects"] == [{"kind": "ServiceAccount", "name": "hai-sa", "namespace": "ml"}]
    verbs = {r["resources"][0]: r["verbs"] for r in docs[0]["rules"]}
    assert set(verbs["pods"]) >= {"create", "delete", "watch", "list"}
    assert verbs["pods/log"] == ["get"]
    assert verbs["pods/exec"] == ["get", "create"]


def all_containers(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def test_a_pod_mounts_only_its_own_sub_paths_of_the_nas() -> None:
    opts = m.KubernetesOptions(nas_pvc="nas", nas_mount_path="/nas")
    (pod,) = m.worker_pods(standalone(), opts)
    nas = [v for v in pod["spec"]["containers"][0]["volumeMounts"] if v["name"] == "nas"]
    assert nas == [
        {"name": "nas", "mountPath": "/nas/u/proj", "subPath": "u/proj"},
        {"name": "nas", "mountPath": MODEL_DIR, "subPath": "hai/jobs/7/model"},
    ]
    storages = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "storage" in v["name"]
    }
    assert storages == {"storage-10111": "pvc-10111", "storage-10222": "pvc-10222"}


@pytest.mark.parametrize(
    ("code_path", "words"),
    [
        pytest.param("/nas", "never all of it", id="the whole volume"),
        pytest.param("/srv/code", "outside", id="off the NAS"),
        pytest.param("/nas/u/../../etc", "'..'", id="dot-dot"),
        pytest.param("/var/run", "system path", id="the Docker socket's directory"),
    ],
)
def test_a_path_that_is_not_a_sub_path_of_the_nas_is_never_mounted(code_path: str, words: str) -> None:
    spec = CpuJobSpec(task_name="t", code_path=code_path, cmd="true")
    with pytest.raises(StartError, match=r"spec\.code_path") as e:
        m.worker_pods(launch(spec, ()), m.KubernetesOptions(nas_pvc="nas"))
    assert words in str(e.value)


def test_a_symlink_out_of_the_users_roots_is_refused_at_launch(tmp_path: Path) -> None:
    """The server resolves the link (it mounts the NAS at the same path) before the pod exists."""
    nas = tmp_path / "nas"
    for d in ("alice/code", "bob/secret"):
        (nas / d).mkdir(parents=True)
    (nas / "alice/link").symlink_to(nas / "bob/secret")
    rules = PathRules(allowed=(str(nas / "alice"),), home=str(nas / "hai"), own_dir=str(nas / "hai/jobs/7"))
    opts = m.KubernetesOptions(nas_pvc="nas", nas_mount_path=str(nas))
    job = JobEnvironment(user="alice", group="vision", model_dir=nas / "hai/jobs/7/model")
    ok = launch(CpuJobSpec(task_name="t", code_path=str(nas / "alice/code"), cmd="true"), (), paths=rules)
    mounts = m.worker_pods(replace(ok, job=job), opts)[0]["spec"]["containers"][0]["volumeMounts"]
    assert [v["subPath"] for v in mounts if v["name"] == "nas"] == ["alice/code", "hai/jobs/7/model"]
    bad = launch(CpuJobSpec(task_name="t", code_path=str(nas / "alice/link"), cmd="true"), (), paths=rules)
    with pytest.raises(StartError, match="resolves to"):
        m.worker_pods(replace(bad, job=job), opts)


def test_every_container_runs_unprivileged_with_the_configured_user() -> None:
    opts = m.KubernetesOptions(
        nas_pvc="nas", run_as_user=1000, run_as_group=100, run_as_non_root=True, fs_group=100
    )
    pods = [*m.worker_pods(standalone(), opts), *m.worker_pods(distributed(), opts)]
    job = m.mpijob(distributed(), opts)
    templates = {role: r["template"]["spec"] for role, r in job["spec"]["mpiReplicaSpecs"].items()}
    for spec in [p["spec"] for p in pods] + list(templates.values()):
        assert spec["securityContext"] == {
            "seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 1000, "runAsGroup": 100,
            "runAsNonRoot": True, "fsGroup": 100,
        }  # fmt: skip
        assert spec["automountServiceAccountToken"] is False
        for c in all_containers(spec):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["privileged"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # Only sshd in the MPI workers gets back what it needs; the job's own containers keep nothing.
    assert templates["Worker"]["containers"][0]["securityContext"]["capabilities"]["add"] == list(
        m.SSHD_CAPABILITIES
    )
    assert "add" not in pods[0]["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert "add" not in templates["Launcher"]["containers"][0]["securityContext"]["capabilities"]


def test_with_run_as_each_pod_runs_as_its_owners_account() -> None:
    alice = JobUser("alice", 1201, 1201, (1201, 1300))
    opts = m.KubernetesOptions(nas_pvc="nas", run_as="{user}", fs_group=100)
    (pod,) = m.worker_pods(standalone(), opts, account=alice)
    assert pod["spec"]["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 1201, "runAsGroup": 1201,
        "supplementalGroups": [1300], "fsGroup": 100,
    }  # fmt: skip
    with pytest.raises(ValidationError, match="keep one"):
        m.KubernetesOptions(run_as="{user}", run_as_user=1000)


def test_a_given_service_account_gets_its_token_mounted() -> None:
    (pod,) = m.worker_pods(standalone(), m.KubernetesOptions(service_account="trainer"))
    assert (
        pod["spec"]["serviceAccountName"] == "trainer" and pod["spec"]["automountServiceAccountToken"] is True
    )


@pytest.mark.parametrize("given", ["a100", "A100", " a100 "])
def test_the_node_selector_gets_the_canonical_gpu_type(given: str) -> None:
    spec = StandaloneJobSpec(task_name="t", code_path="/nas/u/p", cmd="true", resource_pkg=1, gpu_type=given)
    (pod,) = m.worker_pods(launch(spec, (WorkerPlacement("node-a", (0,)),)), m.KubernetesOptions())
    assert pod["spec"]["nodeSelector"] == {"hai.io/gpu-type": "A100"}


def test_a_per_gpu_gang_runs_the_rank_launcher_and_finds_worker_0_by_its_dns_name() -> None:
    pods = m.worker_pods(distributed(), m.KubernetesOptions(namespace="hai"))
    master = "hai-42-w0.hai-42"
    for rank, pod in enumerate(pods):
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        # /bin/sh -c <python3 or why not> <launcher> <processes> <first rank> <serve> <command>
        serve = "0.0.0.0:29400" if rank == 0 else "-"
        assert container["command"][4:] == ["8", str(rank * 8), serve, "python3 train_hvd.py"]
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == env["MASTER_ADDR"] == master
        assert (env["HOROVOD_SIZE"], env["HOROVOD_CROSS_RANK"], env["HOROVOD_GLOO_IFACE"]) == (
            "16",
            str(rank),
            "eth0",
        )
    ports = {
        p["name"]: p["port"] for p in m.gang_service(distributed(), m.KubernetesOptions())["spec"]["ports"]
    }
    assert ports == {"torch": 29500, "horovod": 29400}
    # An MPIJob's ranks meet through mpirun, never through a store nobody serves.
    launcher = m.mpijob(distributed(), m.KubernetesOptions())["spec"]["mpiReplicaSpecs"]["Launcher"]
    names = {e["name"] for e in launcher["template"]["spec"]["containers"][0]["env"]}
    assert not {n for n in names if n.startswith("HOROVOD_")}


def test_on_the_host_network_a_gang_meets_at_worker_0s_node_on_ports_of_its_own() -> None:
    opts = m.KubernetesOptions(network="host", host_iface="ens5")
    assert not m.uses_service(distributed(), opts)  # no DNS name is needed, so no Service is made
    pods = m.worker_pods(distributed(), opts, "10.0.0.7")
    envs = [{e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]} for p in pods]
    for pod, env in zip(pods, envs, strict=True):
        assert (pod["spec"]["hostNetwork"], pod["spec"]["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
        assert "hostname" not in pod["spec"] and "subdomain" not in pod["spec"]
        assert env["MASTER_ADDR"] == env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.7"
        assert env["HOROVOD_GLOO_IFACE"] == env["NCCL_SOCKET_IFNAME"] == "ens5"
    # Instance 42's ports on a node every instance shares: never the well-known 29500/29400.
    assert (envs[0]["MASTER_PORT"], envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"]) == ("20042", "30042")
    assert pods[0]["spec"]["containers"][0]["command"][6] == "0.0.0.0:30042"
    # A standalone per-gpu job meets inside its one pod, still on ports of its own.
    job = standalone(processes="per-gpu")
    (pod,) = m.worker_pods(job, opts)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["HOROVOD_GLOO_IFACE"]) == ("127.0.0.1", "20042", "lo")


def test_an_mpijob_is_refused_on_the_host_network() -> None:
    with pytest.raises(ValueError, match='needs network = "pod"'):
        m.KubernetesOptions(network="host", mpi_operator="always")


def test_a_per_worker_job_runs_its_command_in_a_shell_once_per_pod() -> None:
    job = distributed()
    job = replace(job, spec=job.spec.model_copy(update={"processes": "per-worker"}))
    pods = m.worker_pods(job, m.KubernetesOptions())
    assert [p["spec"]["containers"][0]["command"] for p in pods] == [
        ["/bin/sh", "-c", "python3 train_hvd.py"]
    ] * 2
    env = {e["name"]: e["value"] for e in pods[1]["spec"]["containers"][0]["env"]}
    assert (env["RANK"], env["WORLD_SIZE"]) == ("1", "2")


def per_gpu_gang() -> Launch:
    spec = DistributedJobSpec(
        task_name="hvd", code_path="/nas/u/proj", cmd="python3 train_hvd.py", workers=2,
        worker_resource_pkg=2, env={"MY_SETTING": "a b", "NCCL_DEBUG": "INFO"},
    )  # fmt: skip
    placement = tuple(WorkerPlacement(f"node-{i}", (0, 1), cpus=8, memory_gb=64) for i in range(2))
    base = launch(spec, placement)
    return replace(base, job=replace(base.job, resume=True))


def test_mpirun_forwards_every_variable_of_the_launchers_env_to_every_rank() -> None:
    job = m.mpijob(per_gpu_gang(), m.KubernetesOptions(namespace="hai"))
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    argv = launcher["command"]
    forwarded = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"]
    env = {e["name"] for e in launcher["env"]}
    # Each once, by name (mpirun takes the launcher's value); NCCL_DEBUG keeps the platform's quiet default.
    assert sorted(forwarded) == sorted(
        {*env, "PATH", "LD_LIBRARY_PATH"} - {"NCCL_DEBUG"} | {"NCCL_DEBUG=WARN"}
    )
    assert {"HAI_JOB_ID", "HAI_RESUME", "HAI_MODEL_DIR", "HAI_PREEMPT_NOTICE", "MY_SETTING"} <= set(forwarded)
    assert argv[argv.index("/bin/sh") :] == ["/bin/sh", "-c", "/bin/sh -c 'python3 train_hvd.py'"]


def test_an_mpijob_sets_its_policies_where_v2beta1_reads_them() -> None:
    spec = m.mpijob(per_gpu_gang(), m.KubernetesOptions(namespace="hai"))["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    for replica in spec["mpiReplicaSpecs"].values():
        assert replica["restartPolicy"] == "Never"
        assert "restartPolicy" not in replica["template"]["spec"]  # else: SetPodTemplateRestartPolicy


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        pytest.param([], None, id="no conditions yet: not ended"),
        pytest.param([condition("Created"), condition("Running")], None, id="running: not ended"),
        pytest.param([condition("Failed", "False")], None, id="a False Failed condition is no end"),
        pytest.param(
            [condition("Running", "False"), condition("Succeeded", reason="MPIJobSucceeded")],
            "the MPIJob succeeded (MPIJobSucceeded)", id="succeeded",
        ),
        pytest.param(
            [condition("Running"), condition("Failed", reason="BackoffLimitExceeded", message="rank 1")],
            "the MPIJob failed (BackoffLimitExceeded: rank 1)", id="failed, with the operator's words",
        ),
    ],
)  # fmt: skip
def test_an_mpijobs_end_is_its_succeeded_or_failed_condition(
    conditions: list[dict[str, str]], expected: str | None
) -> None:
    ended = mpijob_end({"status": {"conditions": conditions}})
    assert (ended.words if ended is not None else None) == expected


def test_a_field_the_api_server_dropped_is_named_by_its_path() -> None:
    sent = {"a": 1, "b": {"c": 2, "d": 3}, "l": [{"x": 1}, {"y": 2}]}
    kept = {"a": 1, "b": {"c": 2}, "l": [{"x": 1}, {}], "default": True}
    assert dropped_fields(sent, kept, "spec") == ["spec.b.d", "spec.l[1].y"]
    assert dropped_fields(sent, sent) == []


def test_the_gpu_resource_and_labels_follow_the_device_plugin_and_are_configurable() -> None:
    """NVIDIA's device plugin by default; another vendor's resource and labels when configured."""
    spec = StandaloneJobSpec(task_name="t", code_path="/nas/u/p", cmd="true", resource_pkg=1, gpu_type="V100")
    job = launch(spec, (WorkerPlacement("node-a", (0, 1)),))
    (pod,) = m.worker_pods(job, m.KubernetesOptions())
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    other = m.KubernetesOptions(gpu_resource="amd.com/gpu", gpu_type_label="example.com/gpu-kind")
    (pod,) = m.worker_pods(job, other)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "2"}
    assert pod["spec"]["tolerations"][0]["key"] == "amd.com/gpu"
    assert pod["spec"]["nodeSelector"] == {"example.com/gpu-kind": "V100"}


@pytest.mark.parametrize("field", ["gpu_resource", "gpu_type_label", "gpu_product_label"])
def test_a_malformed_resource_or_label_name_is_refused(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        m.KubernetesOptions(**{field: "not a/valid/name"})
