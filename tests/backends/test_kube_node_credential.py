"""A pod on a real node reaches `hai serve` at `[server] job_url` and acts for its owner with the job
credential its Secret mounts (busybox's wget stands in for `hai`): it submits the next job, which is
the owner's and names the job it came from, and an admin action is refused."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hai_airflow.spec import CpuJobSpec
from tests.backends.test_kube_node import Site, _wait, close_site, server_config, wait_state
from tests.support.kube_apiserver import SERVER_TOKEN, grant_server_rbac
from tests.support.kube_node import Cluster, nas_claim
from tests.support.live_server import LiveServer, free_port

pytestmark = [pytest.mark.kube, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture
def site(kube_node: Cluster, tmp_path: Path) -> Iterator[Site]:
    """`hai serve` on the node with job_url: its pods share the host's network, so the loopback is it."""
    from kubernetes import client

    namespace = f"hai-cred-{uuid.uuid4().hex[:6]}"
    admin = kube_node.admin()
    core = client.CoreV1Api(admin)
    core.create_namespace({"metadata": {"name": namespace}})
    grant_server_rbac(admin, namespace)
    nas = tmp_path / "nas"
    (nas / "code").mkdir(parents=True)
    nas_claim(core, namespace, nas)
    _wait(lambda: core.read_namespaced_persistent_volume_claim("hai-nas", namespace).status.phase == "Bound",
          "the NAS claim to be bound")  # fmt: skip
    accounts = lambda: core.list_namespaced_service_account(namespace).items  # noqa: E731
    _wait(lambda: any(sa.metadata.name == "default" for sa in accounts()), "the default service account")
    kubeconfig = kube_node.api.kubeconfig(SERVER_TOKEN, tmp_path / "server.kubeconfig")
    port = free_port()
    config = server_config(kube_node, kubeconfig, namespace, nas, "affinity").replace(
        'backend = "kubernetes"\n', f'backend = "kubernetes"\njob_url = "http://127.0.0.1:{port}"\n', 1
    )
    live = LiveServer(nas / "hai-home", config, port=port).start()
    s = Site(kube_node, live, namespace, nas)
    try:
        yield s
    finally:
        close_site(s)


def test_a_pod_submits_the_next_job_as_its_owner_with_its_mounted_credential(
    site: Site, busybox_image: str
) -> None:
    next_spec = {"mode": "cpu", "task_name": "next", "code_path": str(site.code), "image": busybox_image}
    (site.code / "next.json").write_text(json.dumps({"spec": {**next_spec, "cmd": "true", "cpus": 0.2}}))
    cmd = (
        'ls -l "$HAI_TOKEN_FILE"; auth="Authorization: Bearer $(cat "$HAI_TOKEN_FILE")"; '
        'wget -q -O - --header "$auth" "$HAI_SERVER/api/v1/whoami"; echo; '
        'wget -q -O - --header "$auth" --header "Content-Type: application/json" '
        '--post-file next.json "$HAI_SERVER/api/v1/jobs" > /dev/null && echo submitted; '
        'wget -q -O - --header "$auth" "$HAI_SERVER/api/v1/quotas" || echo "quotas refused"'
    )
    spec = CpuJobSpec(task_name="cpu stage", code_path=str(site.code), cmd=cmd, image=busybox_image,
                      cpus=0.2, memory_gb=0.25)  # fmt: skip
    with site.live.client("lena-token") as lena:
        job = lena.submit(spec)
        done = wait_state(lena, job.id, "SUCCEEDED", "FAILED")
        (instance,) = lena.instances(job.id)
        log = lena.log(instance.id)
        assert done.state == "SUCCEEDED", (done.reason, log)
        assert "/hai/credential/token" in log and '"user":"lena"' in log and f'"via":"job {job.id}"' in log, (
            log
        )
        assert "submitted" in log and "quotas refused" in log, log
        (made,) = [j for j in lena.jobs() if j.task_name == "next"]
        assert (made.user, made.submitted_via) == ("lena", f"job {job.id}")
        wait_state(lena, made.id, "SUCCEEDED", "FAILED")
    # The run is over: its Secret is gone with its pod.
    from kubernetes import client

    core = client.CoreV1Api(site.cluster.admin())
    _wait(lambda: not core.list_namespaced_secret(site.namespace, label_selector="hai.io/owner").items,
          "the credentials' Secrets removed")  # fmt: skip
