"""The kubernetes backend against a real kube-apiserver; the tests play kubelet (and the MPI Operator)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.backends.common.base import Handle
from hai_airflow.backends.kubernetes import manifests as m
from tests.support.kube_apiserver import ADMIN_TOKEN, ApiServer, KubeTest, wait_until

pytestmark = [pytest.mark.kube, pytest.mark.slow]

NODES = {
    "gpu-node-0": ({"hai.io/gpu-type": "V100"}, {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}),
    "gpu-node-1": (
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        {"nvidia.com/gpu": "4", "cpu": "64000m", "memory": "500Gi"},
    ),
    "cpu-node": ({}, {"cpu": "16", "memory": "64Gi"}),
    "lower-node": ({"hai.io/gpu-type": "t4"}, {"nvidia.com/gpu": "2", "cpu": "8", "memory": "32Gi"}),
}


@pytest.fixture(scope="session")
def nodes(kube_apiserver: ApiServer) -> list[str]:
    """Node objects as kubelets would register them (one of them cordoned)."""
    from kubernetes import client

    core = client.CoreV1Api(kube_apiserver.api_client(ADMIN_TOKEN))
    for name, (labels, allocatable) in {**NODES, "cordoned": ({}, {"nvidia.com/gpu": "8"})}.items():
        spec = {"unschedulable": name == "cordoned"}
        core.create_node({"metadata": {"name": name, "labels": labels}, "spec": spec})
        status = {"capacity": allocatable, "allocatable": allocatable}
        core.patch_node_status(name, {"status": status})
    return sorted(NODES)


@pytest.fixture
def kube(kube_apiserver: ApiServer, nodes: list[str], tmp_path: Path) -> Iterator[KubeTest]:
    test = KubeTest(kube_apiserver, tmp_path, f"t-{uuid.uuid4().hex[:8]}")
    try:
        yield test
    finally:
        test.cleanup()


def env_of(container: Any) -> dict[str, str]:
    return {e.name: e.value for e in container.env}


def wait_exit(backend: Any, instance_id: int, timeout: float = 10) -> Any:
    ended: list[Any] = []
    wait_until(lambda: ended, f"instance {instance_id}'s exit", timeout, lambda: ended.extend(backend.poll()))
    assert [e.instance_id for e in ended] == [instance_id]
    return ended[0]


def test_inventory_reads_allocatable_gpus_and_the_gpu_type_labels(kube: KubeTest) -> None:
    inventory = {n.name: n for n in kube.backend().inventory()}
    assert "cordoned" not in inventory
    assert (inventory["gpu-node-0"].gpu_type, inventory["gpu-node-0"].gpus) == ("V100", 8)
    assert (inventory["gpu-node-0"].cpus, inventory["gpu-node-0"].memory_gb) == (32.0, 256.0)
    # Without the platform's label, the GPU feature discovery label names the type.
    assert (inventory["gpu-node-1"].gpu_type, inventory["gpu-node-1"].gpus) == ("A100", 4)
    assert inventory["gpu-node-1"].cpus == 64.0
    assert (inventory["cpu-node"].gpus, inventory["cpu-node"].gpu_type) == (0, "none")
    assert inventory["lower-node"].gpu_type == "T4"  # one spelling of a type, whatever the label says


def test_inventory_reads_the_configured_gpu_resource_and_product_label(kube: KubeTest) -> None:
    """A cluster whose device plugin advertises another resource: only its nodes count GPUs."""
    backend = kube.backend(gpu_resource="example.com/gpu", gpu_product_label="hai.io/gpu-type")
    inventory = {n.name: n for n in backend.inventory()}
    assert inventory["gpu-node-0"].gpus == 0 and inventory["gpu-node-0"].gpu_type == "V100"
    assert inventory["gpu-node-1"].gpu_type == "none", "the NVIDIA product label is not read any more"


def test_standalone_job_is_one_pinned_pod_with_gpus_shm_storage_and_labels(kube: KubeTest) -> None:
    backend = kube.backend()
    launch = kube.launch(
        gpus=((2, 5),), nodes=("gpu-node-0",), cpus=4, memory_gb=16, shm=512,
        project_storage=(10111,), storages={10111: "pvc-project-10111"}, gpu_type="V100",
        env={"EXTRA": "1"},
    )  # fmt: skip
    handle = backend.start(launch)
    assert handle.data["pods"] == [f"hai-{launch.instance_id}-w0"]
    pod = kube.pod(handle.data["pods"][0])
    assert pod.metadata.labels == {
        "hai.io/owner": "hai", "hai.io/job-id": str(launch.job_id),
        "hai.io/instance-id": str(launch.instance_id), "hai.io/worker": "0",
    }  # fmt: skip
    assert pod.metadata.annotations["hai.io/task-name"] == launch.spec.task_name
    spec = pod.spec
    assert spec.restart_policy == "Never"
    assert spec.termination_grace_period_seconds == 0
    required = spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    term = required.node_selector_terms[0]
    assert (term.match_fields[0].key, term.match_fields[0].values) == ("metadata.name", ["gpu-node-0"])
    assert spec.node_selector == {"hai.io/gpu-type": "V100"}
    (main,) = spec.containers
    assert main.resources.limits == {"nvidia.com/gpu": "2", "cpu": "4", "memory": "16Gi"}
    assert main.resources.requests == main.resources.limits
    assert main.image_pull_policy == "IfNotPresent"
    assert main.working_dir == "/nas/code"
    assert main.command == ["/bin/sh", "-c", "python3 train.py"]
    volumes = {v.name: v for v in spec.volumes}
    assert volumes["shm"].empty_dir.medium == "Memory" and volumes["shm"].empty_dir.size_limit == "512Mi"
    assert volumes["storage-10111"].persistent_volume_claim.claim_name == "pvc-project-10111"
    mounts = {v.name: v.mount_path for v in main.volume_mounts}
    assert mounts["shm"] == "/dev/shm" and mounts["storage-10111"] == "/mnt/storage/10111"
    env = env_of(main)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the device plugin's GPUs, numbered from 0
    assert env["HAI_JOB_ID"] == str(launch.job_id) and env["EXTRA"] == "1"
    assert env["HAI_PROJECT_STORAGE_10111"] == "/mnt/storage/10111"
    assert env["HAI_PREEMPT_NOTICE"] == m.NOTICE_PATH
    assert "RANK" not in env
    assert [t.key for t in spec.tolerations if t.key == "nvidia.com/gpu"] == ["nvidia.com/gpu"]


def test_a_pod_mounts_only_its_sub_paths_of_the_nas_and_runs_unprivileged(kube: KubeTest) -> None:
    backend = kube.backend(nas_pvc="hai-nas", run_as_user=1000, run_as_group=1000, fs_group=1000)
    launch = kube.launch(nodes=("gpu-node-0",), gpus=((0,),), code_path="/nas/alice/code", gpu_type="v100")
    launch = replace(launch, job=replace(launch.job, model_dir=Path("/nas/hai/jobs/7/model")))
    pod = kube.pod(backend.start(launch).data["pods"][0])
    (nas,) = [v for v in pod.spec.volumes if v.persistent_volume_claim is not None]
    assert nas.persistent_volume_claim.claim_name == "hai-nas"
    (main,) = pod.spec.containers
    mounts = [(v.mount_path, v.sub_path) for v in main.volume_mounts if v.name == nas.name]
    assert mounts == [("/nas/alice/code", "alice/code"), ("/nas/hai/jobs/7/model", "hai/jobs/7/model")]
    context = pod.spec.security_context
    assert (context.run_as_user, context.run_as_group, context.fs_group) == (1000, 1000, 1000)
    assert context.seccomp_profile.type == "RuntimeDefault"
    assert main.security_context.allow_privilege_escalation is False
    assert main.security_context.capabilities.drop == ["ALL"] and not main.security_context.capabilities.add
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.node_selector == {"hai.io/gpu-type": "V100"}


def test_pin_by_node_name_and_git_code_through_an_init_container(kube: KubeTest) -> None:
    backend = kube.backend(pin="node_name", git_image="hai/git:1")
    launch = kube.launch(
        mode="cpu", gpus=((),), nodes=("cpu-node",), code_src="git",
        code_path="https://git.example.com/team/model.git", git_branch="dev",
    )  # fmt: skip
    handle = backend.start(launch)
    spec = kube.pod(handle.data["pods"][0]).spec
    assert spec.node_name == "cpu-node" and spec.affinity is None
    (init,) = spec.init_containers
    assert init.image == "hai/git:1"
    assert init.command[-4:] == ["dev", "--", "https://git.example.com/team/model.git", "/hai/code"]
    assert spec.containers[0].working_dir == "/hai/code"
    env = env_of(spec.containers[0])
    assert "CUDA_VISIBLE_DEVICES" in env and not env["CUDA_VISIBLE_DEVICES"]  # a CPU job sees no GPU
    assert spec.containers[0].resources is None or not spec.containers[0].resources.limits


def test_the_watch_reports_exit_codes_and_the_pods_are_removed(kube: KubeTest) -> None:
    backend = kube.backend()
    ok, bad = kube.launch(), kube.launch()
    h_ok, h_bad = backend.start(ok), backend.start(bad)
    for h in (h_ok, h_bad):
        kube.set_running(h.data["pods"][0])
    assert backend.poll() == []
    kube.set_terminated(h_bad.data["pods"][0], 3)
    ended = wait_exit(backend, bad.instance_id)
    assert (ended.exit_code, ended.reason, ended.lost) == (3, "exit code 3", False)
    kube.set_terminated(h_ok.data["pods"][0], 0)
    ended = wait_exit(backend, ok.instance_id)
    assert (ended.exit_code, ended.reason) == (0, "completed")
    wait_until(lambda: not kube.pods(), "pod removal")
    # No kubelet serves logs here: the log says so instead of being silently empty.
    assert "no log could be read" in backend.read_log(ok.instance_id)


def test_an_invalid_image_fails_the_instance_at_once(kube: KubeTest) -> None:
    backend = kube.backend()
    launch = kube.launch(image="Not A Valid Image")
    handle = backend.start(launch)
    kube.set_waiting(handle.data["pods"][0], "InvalidImageName", "couldn't parse image reference")
    ended = wait_exit(backend, launch.instance_id)
    assert ended.exit_code is None and not ended.lost
    assert "InvalidImageName" in ended.reason


def test_suspend_of_a_standalone_job_deletes_its_pod_without_grace(kube: KubeTest) -> None:
    backend = kube.backend(pin="node_name")
    launch = kube.launch(nodes=("gpu-node-0",))
    handle = backend.start(launch)
    kube.set_running(handle.data["pods"][0])
    wait_until(lambda: backend.poll() == [] and True, "the watch")
    backend.stop(launch.instance_id, grace_seconds=0, notice=False)
    # Grace 0 removes even a bound pod at once: nothing waits for the node.
    assert kube.pods() == []
    ended = wait_exit(backend, launch.instance_id)
    assert ended.reason.startswith("stopped by the platform") and not ended.lost


def test_elastic_suspend_annotates_and_deletes_with_the_grace_then_reports_the_exit(kube: KubeTest) -> None:
    backend = kube.backend(pin="node_name")
    launch = kube.launch(nodes=("gpu-node-0",), elastic=True, grace_seconds=45)
    handle = backend.start(launch)
    name = handle.data["pods"][0]
    pod = kube.pod(name)
    assert pod.spec.termination_grace_period_seconds == 45
    pre_stop = pod.spec.containers[0].lifecycle.pre_stop._exec.command
    assert m.NOTICE_PATH in pre_stop[-1]  # the kubelet writes the notice, then sends SIGTERM
    kube.set_running(name)
    wait_until(lambda: backend._pods.get(name) and backend._pods[name].running, "the watch to see Running")
    backend.stop(launch.instance_id, grace_seconds=45, notice=True)
    pod = kube.pod(name)
    assert pod.metadata.deletion_timestamp is not None
    assert pod.metadata.deletion_grace_period_seconds == 45
    assert json.loads(pod.metadata.annotations[m.ANNOTATION_STOP])["notice"] is True
    assert backend.poll() == []  # still terminating: no exit yet
    # The kubelet: the job saved and exited 75 within the grace, then the pod goes.
    kube.set_terminated(name, 75)
    kube.force_delete(name)
    ended = wait_exit(backend, launch.instance_id)
    assert (ended.exit_code, ended.reason) == (75, "exit code 75")


def test_distributed_without_mpi_operator_is_a_gang_with_a_headless_service(kube: KubeTest) -> None:
    backend = kube.backend()
    launch = kube.launch(mode="distributed", gpus=((0, 1, 2, 3), (4, 5, 6, 7)), worker_image="img/worker:2")
    handle = backend.start(launch)
    iid = launch.instance_id
    assert handle.data["kind"] == "pods" and handle.data["service"] == f"hai-{iid}"
    service = kube.core.read_namespaced_service(f"hai-{iid}", kube.ns)
    assert service.spec.cluster_ip == "None" and service.spec.publish_not_ready_addresses is True
    assert service.spec.selector == {"hai.io/owner": "hai", "hai.io/job-id": str(launch.job_id),
                                     "hai.io/instance-id": str(iid)}  # fmt: skip
    for rank, name in enumerate(handle.data["pods"]):
        pod = kube.pod(name)
        assert (pod.spec.hostname, pod.spec.subdomain) == (name, f"hai-{iid}")
        assert pod.spec.containers[0].image == "img/worker:2"
        env = env_of(pod.spec.containers[0])
        # One process per GPU: the pod runs the rank launcher; worker 0's serves the Horovod rendezvous.
        serve = "0.0.0.0:29400" if rank == 0 else "-"
        assert pod.spec.containers[0].command[4:] == ["4", str(4 * rank), serve, "python3 train.py"]
        assert (env["WORLD_SIZE"], env["HOROVOD_SIZE"], env["HOROVOD_CROSS_RANK"]) == ("8", "8", str(rank))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (f"hai-{iid}-w0.hai-{iid}", "29500")
        assert env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == env["MASTER_ADDR"]
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_a_gang_meeting_at_pod_ips_makes_the_others_once_worker_0_has_an_ip(kube: KubeTest) -> None:
    backend = kube.backend(gang_address="pod_ip")
    launch = kube.launch(mode="distributed", gpus=((0,), (1,)))
    first, second = backend.start(launch).data["pods"]
    time.sleep(0.5)  # what the watch would do on its own is done by now
    assert [p.metadata.name for p in kube.pods()] == [first]
    (own_ip, *_) = kube.pod(first).spec.containers[0].env
    assert (own_ip.name, own_ip.value_from.field_ref.field_path) == ("HAI_POD_IP", "status.podIP")
    assert env_of(kube.pod(first).spec.containers[0])["MASTER_ADDR"] == "$(HAI_POD_IP)"
    has_ip = {"status": {"phase": "Pending", "podIP": "198.18.0.7"}}
    kube.core.patch_namespaced_pod_status(first, kube.ns, has_ip)
    wait_until(lambda: len(kube.pods()) == 2, "the second worker's pod")
    env = env_of(kube.pod(second).spec.containers[0])
    assert env["MASTER_ADDR"] == env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "198.18.0.7"


def test_a_restart_before_the_others_are_made_sends_the_gang_back_at_once(kube: KubeTest) -> None:
    first = kube.backend(gang_address="pod_ip")
    launch = kube.launch(mode="distributed", gpus=((0,), (1,)))
    handle = first.start(launch)
    first.close()  # the server dies before worker 0's pod has an IP: worker 1's pod is never made
    kube.set_running(handle.data["pods"][0])
    restarted = kube.backend(gang_address="pod_ip")
    (ended,) = restarted.reattach([handle])
    assert (ended.instance_id, ended.lost, ended.exit_code) == (launch.instance_id, True, None)
    assert f"pod {handle.data['pods'][1]} is missing after a restart" in ended.reason
    wait_until(lambda: not kube.pods(), "worker 0's pod removed")
    assert restarted.poll() == []


def test_a_gang_not_fully_running_in_time_is_torn_down_and_requeued(kube: KubeTest) -> None:
    backend = kube.backend(start_timeout_seconds=1.5)
    launch = kube.launch(mode="distributed", gpus=((0,), (1,)))
    handle = backend.start(launch)
    kube.set_running(handle.data["pods"][0])
    kube.set_waiting(handle.data["pods"][1], "ContainerCreating")
    ended = wait_exit(backend, launch.instance_id)
    assert ended.lost and ended.exit_code is None
    assert "1 of 2 running" in ended.reason and "ContainerCreating" in ended.reason
    wait_until(lambda: not kube.pods(), "pod removal")
    assert kube.core.list_namespaced_service(kube.ns).items == []


def test_a_failed_gang_worker_takes_the_others_down(kube: KubeTest) -> None:
    backend = kube.backend()
    launch = kube.launch(mode="distributed", gpus=((0,), (1,)))
    handle = backend.start(launch)
    w0, w1 = handle.data["pods"]
    kube.set_running(w0)
    kube.set_running(w1)
    wait_until(lambda: backend._pods.get(w1) and backend._pods[w1].running, "the watch to see Running")
    kube.set_terminated(w1, 9)
    ended = wait_exit(backend, launch.instance_id)
    assert (ended.exit_code, ended.reason) == (9, "worker 1 failed: exit code 9")
    wait_until(lambda: not kube.pods(), "pod removal")


def test_a_new_backend_reattaches_by_label_and_removes_what_no_handle_owns(kube: KubeTest) -> None:
    first = kube.backend()
    alive, gone, orphan = kube.launch(), kube.launch(), kube.launch()
    h_alive, h_gone = first.start(alive), first.start(gone)
    first.start(orphan)  # started, but the server died before recording it
    first.close()
    kube.force_delete(h_gone.data["pods"][0])
    kube.set_running(h_alive.data["pods"][0])

    restarted = kube.backend()
    stored = [Handle(h.instance_id, json.loads(json.dumps(dict(h.data)))) for h in (h_alive, h_gone)]
    lost = restarted.reattach(stored)
    assert [(e.instance_id, e.lost) for e in lost] == [(gone.instance_id, True)]
    assert [p.metadata.name for p in kube.pods()] == [h_alive.data["pods"][0]]
    assert restarted.poll() == []
    kube.set_terminated(h_alive.data["pods"][0], 0)
    assert wait_exit(restarted, alive.instance_id).exit_code == 0


def test_reap_deletes_the_pods_and_service_of_an_instance_never_recorded(kube: KubeTest) -> None:
    first = kube.backend()
    kept, orphan = kube.launch(), kube.launch(mode="distributed", gpus=((0,), (1,)))
    h_kept = first.start(kept)
    first.start(orphan)  # started, but the server died before recording it
    first.close()
    kube.backend().reap(orphan.instance_id, orphan.work_dir)
    wait_until(lambda: [p.metadata.name for p in kube.pods()] == h_kept.data["pods"], "pod removal")
    assert kube.core.list_namespaced_service(kube.ns).items == []


def test_a_restart_picks_up_an_exit_that_happened_while_the_server_was_down(kube: KubeTest) -> None:
    first = kube.backend()
    launch = kube.launch()
    handle = first.start(launch)
    first.close()
    kube.set_terminated(handle.data["pods"][0], 4)
    restarted = kube.backend()
    assert restarted.reattach([handle]) == []
    assert wait_exit(restarted, launch.instance_id).exit_code == 4


STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
INT32 = {"type": "integer", "format": "int32"}
REPLICA_SPEC = {
    "type": "object",
    "properties": {
        "replicas": INT32,
        "restartPolicy": {"type": "string"},
        "template": {
            "type": "object",
            "properties": {
                "metadata": {"type": "object", "properties": {"labels": STRINGS, "annotations": STRINGS}},
                # The operator's CRD spells out the whole PodSpec (8,000 lines); the API server checks
                # it again when the operator creates the pods from it, so here it is kept as sent.
                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
        },
    },
}
MPIJOB_SCHEMA = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["mpiReplicaSpecs"],
            "properties": {
                # types.go declares this enum; the generated CRD lost it to a typo ("Enum:" for "Enum=").
                "launcherCreationPolicy": {"type": "string", "enum": ["AtStartup", "WaitForWorkersReady"]},
                "mpiImplementation": {"type": "string", "enum": ["OpenMPI", "Intel", "MPICH"]},
                "slotsPerWorker": INT32,
                "runLauncherAsWorker": {"type": "boolean"},
                "sshAuthMountPath": {"type": "string"},
                "runPolicy": {
                    "type": "object",
                    "properties": {
                        "cleanPodPolicy": {"type": "string"},
                        "backoffLimit": INT32,
                        "activeDeadlineSeconds": {"type": "integer", "format": "int64"},
                        "ttlSecondsAfterFinished": INT32,
                        "suspend": {"type": "boolean"},
                    },
                },
                "mpiReplicaSpecs": {"type": "object", "additionalProperties": REPLICA_SPEC},
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "conditions": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "status"],
                        "properties": {
                            key: {"type": "string"}
                            for key in (
                                "type",
                                "status",
                                "reason",
                                "message",
                                "lastUpdateTime",
                                "lastTransitionTime",
                            )
                        },
                    },
                },
                "startTime": {"type": "string", "format": "date-time"},
                "completionTime": {"type": "string", "format": "date-time"},
            },
        },
    },
}
MPIJOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "mpijobs.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "scope": "Namespaced",
        "names": {"plural": "mpijobs", "singular": "mpijob", "kind": "MPIJob", "listKind": "MPIJobList"},
        "versions": [
            {
                "name": "v2beta1",
                "served": True,
                "storage": True,
                # Structural, adapted from kubeflow/mpi-operator's manifests/base/kubeflow.org_mpijobs.yaml
                # (the fields the backend sends), so the API server refuses a field it does not know.
                "schema": {"openAPIV3Schema": MPIJOB_SCHEMA},
                "subresources": {"status": {}},
            }
        ],
    },
}
"""The MPI Operator's CRD. Its controller cannot be built here (its Go modules are not reachable), so
the tests play it: they create the launcher pod and set the MPIJob's status conditions themselves."""


@pytest.fixture
def mpi_crd(kube: KubeTest) -> Iterator[None]:
    """The MPI Operator's CRD, registered for one test (the other tests see a cluster without it)."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(kube.admin_client)
    ext.create_custom_resource_definition(MPIJOB_CRD)

    def served() -> bool:
        try:
            kube.custom.get_api_resources("kubeflow.org", "v2beta1")
            return True
        except client.exceptions.ApiException:
            return False

    wait_until(served, "the MPIJob API to be served", timeout=30)
    try:
        yield
    finally:
        ext.delete_custom_resource_definition("mpijobs.kubeflow.org")
        wait_until(lambda: not served(), "the MPIJob API to go", timeout=60)


def mpijobs(kube: KubeTest) -> list[dict[str, Any]]:
    listed = kube.custom.list_namespaced_custom_object(m.MPI_GROUP, m.MPI_VERSION, kube.ns, m.MPI_PLURAL)
    return list(listed["items"])


def test_distributed_with_the_mpi_operator_is_an_mpijob(kube: KubeTest, mpi_crd: None) -> None:
    backend = kube.backend()
    launch = kube.launch(
        "python3 train_hvd.py", mode="distributed", gpus=((0, 1, 2, 3), (0, 1, 2, 3)),
        nodes=("gpu-node-0", "gpu-node-1"), elastic=True,
    )  # fmt: skip
    handle = backend.start(launch)
    iid = launch.instance_id
    assert handle.data["kind"] == "mpijob" and kube.pods() == []
    (job,) = mpijobs(kube)
    assert job["metadata"]["name"] == f"hai-{iid}"
    assert job["spec"]["slotsPerWorker"] == 4
    replicas = job["spec"]["mpiReplicaSpecs"]
    assert replicas["Worker"]["replicas"] == 2 and replicas["Launcher"]["replicas"] == 1
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"][:4] == ["mpirun", "--allow-run-as-root", "-np", "8"]
    assert launcher["command"][-1] == "/bin/sh -c 'python3 train_hvd.py'"
    worker = replicas["Worker"]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    term = worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-node-0", "gpu-node-1"]
    assert "podAntiAffinity" in worker["affinity"]  # one worker per node
    assert worker["terminationGracePeriodSeconds"] == 60
    # v2beta1: the policies sit on the MPIJob and its replica specs, none in a pod template.
    assert job["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    for role in ("Launcher", "Worker"):
        assert replicas[role]["restartPolicy"] == "Never"
        assert "restartPolicy" not in replicas[role]["template"]["spec"]
    # sshd gives the ranks none of the worker's env: mpirun forwards each variable by name.
    forwarded = {launcher["command"][i + 1] for i, arg in enumerate(launcher["command"]) if arg == "-x"}
    assert {"HAI_JOB_ID", "HAI_INSTANCE_ID", "HAI_RESUME", "HAI_PREEMPT_NOTICE"} <= forwarded
    assert {e["name"] for e in launcher["env"]} <= forwarded | {"NCCL_DEBUG"}

    # Playing the operator: it creates the launcher pod from the template, which keeps our labels.
    template = replicas["Launcher"]["template"]
    pod = {
        "metadata": {
            "name": f"hai-{iid}-launcher",
            "labels": {**template["metadata"]["labels"], m.MPI_ROLE_LABEL: "launcher"},
        },
        "spec": template["spec"],
    }
    kube.core.create_namespaced_pod(kube.ns, pod)
    kube.set_running(f"hai-{iid}-launcher")
    time.sleep(0.3)
    assert backend.poll() == []
    kube.set_terminated(f"hai-{iid}-launcher", 0)
    assert wait_exit(backend, iid).exit_code == 0
    wait_until(lambda: not mpijobs(kube), "MPIJob removal")


def test_the_api_server_refuses_a_wrong_mpijob_field_and_the_backend_a_dropped_one(
    kube: KubeTest, mpi_crd: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.client.exceptions import ApiException

    from hai_airflow.backends.common.base import StartError

    launch = kube.launch("python3 train.py", mode="distributed", gpus=((0, 1), (0, 1)))
    body = m.mpijob(launch, m.KubernetesOptions(namespace=kube.ns))

    def create(spec: dict[str, Any]) -> dict[str, Any]:
        doc = {**body, "metadata": {"name": f"wrong-{uuid.uuid4().hex[:6]}"}, "spec": spec}
        created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
            m.MPI_GROUP, m.MPI_VERSION, kube.ns, m.MPI_PLURAL, doc, field_validation="Strict"
        )
        return created

    # A misspelt value, a wrong type: refused by the schema itself.
    for field, spec in {
        "spec.mpiImplementation": {**body["spec"], "mpiImplementation": "OpenMpi"},
        "spec.slotsPerWorker": {**body["spec"], "slotsPerWorker": "2"},
    }.items():
        with pytest.raises(ApiException) as refused:
            create(spec)
        assert refused.value.status == 422 and field in refused.value.body
    # A field v2beta1 does not have (the restart policy belongs in each replica spec): this API server
    # (1.20) drops it; 1.25 and later refuse it under the fieldValidation=Strict the backend sends.
    stored = create({**body["spec"], "restartPolicy": "Never"})
    assert (
        "restartPolicy" not in stored["spec"]
        and stored["spec"]["launcherCreationPolicy"] == "WaitForWorkersReady"
    )
    # The backend notices a dropped field and refuses to start, naming it, with nothing left behind.
    before = {j["metadata"]["name"] for j in mpijobs(kube)}
    misspelt = {**body, "spec": {**body["spec"], "launcherCreationPolicies": "WaitForWorkersReady"}}
    monkeypatch.setattr(m, "mpijob", lambda launch, opts: misspelt)
    with pytest.raises(
        StartError, match=r"has no field spec\.launcherCreationPolicies: upgrade the operator"
    ):
        kube.backend().start(launch)
    wait_until(
        lambda: {j["metadata"]["name"] for j in mpijobs(kube)} == before, "the refused MPIJob's removal"
    )
    monkeypatch.undo()
    # What the backend sends passes the same schema whole.
    kube.backend().start(launch)
    assert body["metadata"]["name"] in {j["metadata"]["name"] for j in mpijobs(kube)}


def set_mpijob_condition(kube: KubeTest, name: str, kind: str, reason: str, message: str) -> None:
    """Playing the MPI Operator's controller (it cannot be built here): its last word on the job."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [
        {"type": "Running", "status": "False", "reason": "MPIJobRunning", "lastTransitionTime": now},
        {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now},
    ]
    kube.custom.patch_namespaced_custom_object_status(
        m.MPI_GROUP, m.MPI_VERSION, kube.ns, m.MPI_PLURAL, name, {"status": {"conditions": conditions}}
    )


@pytest.mark.parametrize(
    ("kind", "launcher_code", "expected"),
    [
        pytest.param("Succeeded", 0, (0, "completed"), id="Succeeded ends it as completed"),
        pytest.param(
            "Failed", 3, (3, "the MPIJob failed (MPIJobFailed: launcher exited 3)"),
            id="Failed ends it with the launcher's code and the operator's words",
        ),
    ],
)  # fmt: skip
def test_an_mpijob_ends_when_its_conditions_say_so(
    kube: KubeTest, mpi_crd: None, kind: str, launcher_code: int, expected: tuple[int, str]
) -> None:
    backend = kube.backend()
    launch = kube.launch("python3 train.py", mode="distributed", gpus=((0, 1), (0, 1)))
    iid = launch.instance_id
    handle = backend.start(launch)
    name = handle.data["mpijob"]
    (job,) = mpijobs(kube)
    template = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]
    labels = {**template["metadata"]["labels"], m.MPI_ROLE_LABEL: "launcher"}
    pod = {"metadata": {"name": f"{name}-launcher", "labels": labels}, "spec": template["spec"]}
    kube.core.create_namespaced_pod(kube.ns, pod)
    kube.set_running(f"{name}-launcher")
    # mpirun prints every rank's output: an MPIJob's log is its launcher's.
    assert [w.name for w in backend.worker_logs(handle)] == [f"pod {name}-launcher"]
    time.sleep(0.3)
    assert backend.poll() == []
    kube.set_terminated(f"{name}-launcher", launcher_code)
    set_mpijob_condition(kube, name, kind, "MPIJob" + kind, f"launcher exited {launcher_code}")
    ended = wait_exit(backend, iid)
    assert (ended.exit_code, ended.reason) == expected


def test_running_pods_logs_are_asked_of_the_api_and_a_refusal_is_a_clear_line(kube: KubeTest) -> None:
    """No kubelet serves pod logs here: the API server refuses, and the log says so, per worker."""
    backend = kube.backend(pin="node_name")
    launch = kube.launch(
        "python3 train.py", mode="distributed", gpus=((0, 1), (0, 1)), processes="per-worker"
    )
    handle = backend.start(launch)
    pods = handle.data["pods"]
    for name in pods:
        kube.set_running(name)
    asked: list[tuple[str, bool]] = []
    real = backend.core.read_namespaced_pod_log

    def recording(name: str, namespace: str, **kw: Any) -> Any:
        asked.append((name, bool(kw.get("follow"))))
        return real(name, namespace, **kw)

    backend.core.read_namespaced_pod_log = recording
    text = backend.read_log(launch.instance_id)
    lines = text.splitlines()
    assert [line.split(" cannot be read now: ")[0] for line in lines] == [
        f"[hai] the log of pod {p}" for p in pods
    ]
    assert all(line.endswith("it is shown once the instance ends.") for line in lines)
    assert "Traceback" not in text and "HTTP response" not in text
    followed = list(backend.follow_log(launch.instance_id))
    assert sorted(chunk.split("[hai]")[0] for chunk in followed) == ["[worker 0] ", "[worker 1] "]
    assert sorted(asked) == sorted([(p, False) for p in pods] + [(p, True) for p in pods])
