"""The job credential on the kubernetes backend, against a real kube-apiserver: a Secret of the instance's
own, mounted read-only by its pods, made and deleted by the server under its RBAC, which never reads
or lists Secrets."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hai_airflow.backends.kubernetes import manifests as m
from tests.support.kube_apiserver import ApiServer, KubeTest, wait_until

pytestmark = [pytest.mark.kube, pytest.mark.slow]

TOKEN = "job-credential-" + "k" * 32


@pytest.fixture
def kube(kube_apiserver: ApiServer, tmp_path: Path) -> Iterator[KubeTest]:
    test = KubeTest(kube_apiserver, tmp_path, f"c-{uuid.uuid4().hex[:8]}")
    try:
        yield test
    finally:
        test.cleanup()


def credited(kube: KubeTest, **kw: Any) -> Any:
    """A CPU launch (no node to bind) carrying a credential."""
    launch = kube.launch("sleep 60", mode="cpu", gpus=((),), nodes=("",), **kw)
    return replace(launch, job=replace(launch.job, credential=TOKEN, server="http://hai.hai.svc:8765"))


def secrets(kube: KubeTest) -> dict[str, str]:
    """The namespace's Secrets (read as the admin) and the token each holds."""
    found = kube.core.list_namespaced_secret(kube.ns).items
    return {s.metadata.name: base64.b64decode((s.data or {}).get("token", "")).decode() for s in found}


def test_the_pod_mounts_its_own_secret_which_goes_with_the_instance(kube: KubeTest) -> None:
    backend = kube.backend()
    launch = credited(kube)
    handle = backend.start(launch)
    name = m.credential_name(backend.options, launch.instance_id)
    assert secrets(kube) == {name: TOKEN}
    pod = kube.pod(handle.data["pods"][0])
    (main,) = pod.spec.containers
    env = {e.name: e.value for e in main.env}
    assert env["HAI_TOKEN_FILE"] == "/hai/credential/token" and env["HAI_SERVER"] == "http://hai.hai.svc:8765"
    (mount,) = [v for v in main.volume_mounts if v.name == "hai-credential"]
    assert (mount.mount_path, mount.read_only) == ("/hai/credential", True)
    assert TOKEN not in json.dumps(kube.admin_client.sanitize_for_serialization(pod))
    backend.stop(launch.instance_id, 0, False)
    wait_until(lambda: backend.poll(), "the instance's end")
    assert secrets(kube) == {}


def test_reap_and_a_restart_delete_the_secrets_of_instances_no_handle_owns(kube: KubeTest) -> None:
    first = kube.backend()
    reaped, orphan = credited(kube), credited(kube)
    # An earlier attempt at the same instance left its Secret: the start replaces it.
    stale = {
        "metadata": {"name": m.credential_name(first.options, orphan.instance_id)},
        "stringData": {"token": "x"},
    }
    kube.core.create_namespaced_secret(kube.ns, stale)
    first.start(reaped)
    first.start(orphan)  # both started, but the server died before recording either
    first.close()
    assert sorted(secrets(kube).values()) == [TOKEN, TOKEN]
    kube.backend().reap(reaped.instance_id, reaped.work_dir)
    assert list(secrets(kube)) == [m.credential_name(first.options, orphan.instance_id)]
    kube.backend().reattach([])
    wait_until(lambda: not secrets(kube), "the orphan's Secret removed")
