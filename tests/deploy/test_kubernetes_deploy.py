"""deploy/kubernetes/ and the top-level Dockerfile: what a user applies and builds, checked for real.

The base's manifests and both overlays' renderings are validated against Kubernetes' schemas and applied
to the test tier's kube-apiserver (`kubectl apply -k`), the server's ServiceAccount is shown to hold what
the kubernetes backend needs and nothing it must not, and the image runs the base's Deployment and the
prod overlay's two replicas (a controller and a standby that takes over) on a real node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hai_airflow.backends.kubernetes import manifests as m
from hai_airflow.scheduling import POLICIES
from hai_airflow.server.config import ServerConfig, parse_config
from tests.support.docker_engine import Engine
from tests.support.kube_apiserver import ADMIN_TOKEN, ApiServer
from tests.support.kube_apply import apply, kustomize, load_kustomization
from tests.support.kube_node import Cluster
from tests.support.python_base_image import python_base_image

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
BASE = DEPLOY / "base"
OVERLAYS = DEPLOY / "overlays"
KUBECTL = shutil.which("kubectl")
DOCKERFILE = REPO / "Dockerfile"
NAMESPACE = "hai"
SERVICE_ACCOUNT = "hai"
SA_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
VALIDATOR = shutil.which("kubernetes-validate") or str(REPO / ".venv" / "bin" / "kubernetes-validate")
SCHEMA_VERSIONS = ("1.25.0", "1.37.0")
"""The oldest and newest Kubernetes releases the validator knows."""
ADMIN_SECRET = ("hai-admin", "token")
DATABASE_SECRET = ("hai-database", "url")
"""The Secrets (name, key) the user creates; the README tells them how, nothing here ships them."""

Docs = list[dict[str, Any]]


def kube(test: Any) -> Any:
    """A test against the tier's kube-apiserver (skipped, saying why, when there is none)."""
    return pytest.mark.slow(pytest.mark.kube(test))


def slow_docker(test: Any) -> Any:
    """A test that builds the product image on the tier's engine and runs it against its API server."""
    return pytest.mark.slow(pytest.mark.docker(pytest.mark.kube(test)))


def with_kubectl(test: Any) -> Any:
    """A test that renders the overlays with kubectl's built-in kustomize (the path users take)."""
    reason = "no kubectl here (its kustomize renders overlays)"
    return pytest.mark.skipif(KUBECTL is None, reason=reason)(test)


@pytest.fixture(scope="module")
def docs() -> Docs:
    """The base's objects, in its kustomization's order."""
    return [doc for _, doc in load_kustomization(BASE)]


def one(docs: Docs, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def server_config(docs: Docs) -> ServerConfig:
    return parse_config(
        one(docs, "ConfigMap", "hai-config")["data"]["config.toml"], policies=sorted(POLICIES)
    )


def server_container(docs: Docs) -> dict[str, Any]:
    (container,) = one(docs, "Deployment", "hai-server")["spec"]["template"]["spec"]["containers"]
    return dict(container)


# ---- the files themselves ------------------------------------------------------------------------


def test_rbac_yaml_is_exactly_what_the_backends_rbac_printer_prints() -> None:
    """The committed RBAC cannot drift from what the backend needs: regenerate it when this fails with
    `python -m hai_airflow.backends.kubernetes.manifests hai hai > deploy/kubernetes/base/02-rbac.yaml`."""
    printed = subprocess.run(
        [sys.executable, "-m", "hai_airflow.backends.kubernetes.manifests", NAMESPACE, SERVICE_ACCOUNT],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert (BASE / "02-rbac.yaml").read_text() == printed.stdout
    assert printed.stdout == m.rbac_yaml(NAMESPACE, SERVICE_ACCOUNT)


def test_the_base_lists_every_manifest_it_holds_the_namespace_first(docs: Docs) -> None:
    """The base's kustomization names each of its files once, in name order, the namespace first; every
    other object lives in it (or is cluster-wide RBAC), and nothing but manifests lies there."""
    listed = yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]
    files = sorted(p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed == files
    assert docs[0]["kind"] == "Namespace" and docs[0]["metadata"]["name"] == NAMESPACE
    for doc in docs[1:]:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]
    assert {p.suffix for p in BASE.iterdir()} == {".yaml"}
    assert sorted(p.name for p in DEPLOY.iterdir()) == ["base", "overlays"]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted([
        ("Namespace", "hai"), ("ServiceAccount", "hai"),
        ("Role", "hai-server"), ("RoleBinding", "hai-server"),
        ("ClusterRole", "hai-server"), ("ClusterRoleBinding", "hai-server-hai"),
        ("PersistentVolumeClaim", "hai-nas"), ("ConfigMap", "hai-config"), ("Deployment", "hai-server"),
        ("Service", "hai"),
    ])  # fmt: skip


def strictly_valid(files: list[str], version: str, objects: int) -> None:
    """kubernetes-validate --strict of the files against one release's schemas: every object passes."""
    done = subprocess.run(
        [VALIDATOR, "--strict", "-k", version, *files], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" passed for resource ") == objects


no_validator = pytest.mark.skipif(
    not Path(VALIDATOR).exists(), reason="kubernetes-validate is not installed (dev extra)"
)


@no_validator
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_manifest_passes_strict_schema_validation(docs: Docs, version: str) -> None:
    files = sorted({str(path) for path, _ in load_kustomization(BASE)})
    strictly_valid(files, version, len(docs))


@no_validator
@with_kubectl
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_every_overlay_renders_objects_that_pass_strict_schema_validation(
    overlay: str, version: str, tmp_path: Path
) -> None:
    rendered = kustomize(OVERLAYS / overlay)
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(yaml.safe_dump_all(rendered))
    strictly_valid([str(out)], version, len(rendered))


@no_validator
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_the_airflow_executor_files_pass_strict_schema_validation(version: str) -> None:
    """The KubernetesExecutor's task pod template and rules (tests/airflow/test_kubernetes_executor.py)."""
    files = [str(REPO / "deploy" / "airflow" / name) for name in ("pod_template.yaml", "rbac.yaml")]
    strictly_valid(files, version, 3)


def test_no_secret_is_shipped() -> None:
    """The token and the database URL come from Secrets the user creates; no file holds one."""
    text = "".join(p.read_text() for p in DEPLOY.rglob("*.yaml"))
    assert "kind: Secret" not in text and '"kind": "Secret"' not in text
    assert not re.search(r"^\s*token\s*=", text, re.M)
    assert "postgresql+psycopg://" not in text.replace("postgresql+psycopg://hai:PASSWORD@", "")
    create = "kubectl -n hai create secret generic hai-admin --from-literal=token="
    assert create in (BASE / "05-server.yaml").read_text()
    for overlay in ("dev", "prod"):
        assert create in (OVERLAYS / overlay / "kustomization.yaml").read_text(), overlay


def test_the_config_is_a_kubernetes_backend_config_the_server_accepts(docs: Docs) -> None:
    config = server_config(docs)
    assert config.server.backend == "kubernetes"
    assert config.server.database_url is None  # HAI_DATABASE_URL, from a Secret
    opts = m.KubernetesOptions.model_validate(config.backend)
    assert opts.namespace == NAMESPACE
    assert opts.kubeconfig is None and opts.context is None  # in-cluster: the ServiceAccount
    assert (opts.nas_pvc, opts.nas_mount_path) == ("hai-nas", "/nas")
    assert opts.gpu_type_label == "hai.io/gpu-type"
    assert opts.service_account is None  # job pods get no API token
    (admin,) = [u for u in config.users if u.role == "platform_admin"]
    assert admin.token is None and admin.token_env == "HAI_ADMIN_TOKEN"
    assert config.paths.allowed and all(a.startswith("/nas/") for a in config.paths.allowed)


def test_job_pods_get_the_service_as_their_server(docs: Docs) -> None:
    """HAI_SERVER in a job pod is `[server] job_url`: the Service of this deploy, at its port."""
    from urllib.parse import urlsplit

    job_url = server_config(docs).server.job_url
    assert job_url is not None, "[server] job_url is unset: job pods get no HAI_SERVER"
    service = one(docs, "Service", "hai")
    url = urlsplit(job_url)
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert url.hostname in (f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"), job_url
    assert url.port in [p["port"] for p in service["spec"]["ports"]], job_url


def test_the_deployment_wires_the_config_secrets_nas_and_account_together(docs: Docs) -> None:
    config = server_config(docs)
    opts = m.KubernetesOptions.model_validate(config.backend)
    deployment = one(docs, "Deployment", "hai-server")
    spec = deployment["spec"]
    # One controller holds the lease: never two pods, also not during a rollout.
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()

    # The account the RBAC binds is the one the pod runs as, with its token mounted (in-cluster config).
    (binding,) = [d for d in m.rbac(NAMESPACE, {}) if d["kind"] == "RoleBinding"]
    role_binding = one(docs, "RoleBinding", binding["metadata"]["name"])
    assert role_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    assert one(docs, "ServiceAccount")["metadata"]["name"] == pod["serviceAccountName"]
    assert pod.get("automountServiceAccountToken", True) is True

    container = server_container(docs)
    argv = [*container["command"], *container["args"]]
    assert argv[:2] == ["hai", "serve"]
    config_path = Path(argv[argv.index("--config") + 1])
    port = int(argv[argv.index("--port") + 1])
    assert port == config.server.port
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
    # The ConfigMap's key is mounted where --config reads it.
    config_volume = volumes[mounts[str(config_path.parent)]]
    assert config_volume["configMap"]["name"] == "hai-config"
    assert config_path.name in one(docs, "ConfigMap", "hai-config")["data"]
    # The NAS: the claim the config names, mounted where the config says pods see it, and claimed here.
    nas = volumes[mounts[opts.nas_mount_path]]
    assert nas["persistentVolumeClaim"]["claimName"] == opts.nas_pvc
    pvc = one(docs, "PersistentVolumeClaim", opts.nas_pvc)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]

    env = {e["name"]: e for e in container["env"]}
    # $HAI_HOME (job dirs, relative model dirs, kept logs) lies on the NAS, so pods can mount its sub-paths.
    assert Path(env["HAI_HOME"]["value"]).is_relative_to(opts.nas_mount_path)
    assert Path(env["HAI_HOME"]["value"]) != Path(opts.nas_mount_path)
    secret_of = {k: (v["valueFrom"]["secretKeyRef"]["name"], v["valueFrom"]["secretKeyRef"]["key"])
                 for k, v in env.items() if "valueFrom" in v}  # fmt: skip
    assert secret_of == {"HAI_ADMIN_TOKEN": ADMIN_SECRET, "HAI_DATABASE_URL": DATABASE_SECRET}
    for user in config.users:
        assert user.token_env is None or user.token_env in env, f"{user.token_env} is never set"

    # Probes on the health endpoint of the port the server listens on; the Service sends there too.
    (named,) = container["ports"]
    assert named["containerPort"] == port
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": named["name"]}, probe
    service = one(docs, "Service", "hai")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [
        {"name": "http", "port": port, "targetPort": named["name"], "protocol": "TCP"}
    ]

    # Not root, no privilege, and bounded.
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert "memory" in container["resources"]["limits"]


# ---- applied to the real API server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def admin(kube_apiserver: ApiServer) -> Any:
    return kube_apiserver.api_client(ADMIN_TOKEN)


@pytest.fixture(scope="module")
def applied(admin: Any, docs: Docs) -> Docs:
    """Every manifest of the base applied in its kustomization's order."""
    apply(admin, docs)
    return docs


def as_service_account(server: ApiServer) -> Any:
    """The admin's client impersonating the server's ServiceAccount (no token controller runs here)."""
    api = server.api_client(ADMIN_TOKEN)
    api.set_default_header("Impersonate-User", SA_USER)
    return api


@kube
def test_every_object_exists_after_apply_as_written(admin: Any, applied: Docs) -> None:
    from kubernetes import client

    core, apps, rbac = client.CoreV1Api(admin), client.AppsV1Api(admin), client.RbacAuthorizationV1Api(admin)
    assert core.read_namespace(NAMESPACE).status.phase == "Active"
    assert core.read_namespaced_service_account(SERVICE_ACCOUNT, NAMESPACE)
    role = rbac.read_namespaced_role("hai-server", NAMESPACE)
    assert {(r.resources[0], tuple(r.verbs)) for r in role.rules} == {
        (r["resources"][0], tuple(r["verbs"])) for r in one(applied, "Role")["rules"]
    }
    assert rbac.read_namespaced_role_binding("hai-server", NAMESPACE).subjects[0].name == SERVICE_ACCOUNT
    assert rbac.read_cluster_role("hai-server").rules[0].resources == ["nodes"]
    assert rbac.read_cluster_role_binding("hai-server-hai").subjects[0].namespace == NAMESPACE
    pvc = core.read_namespaced_persistent_volume_claim("hai-nas", NAMESPACE)
    assert pvc.spec.access_modes == ["ReadWriteMany"]
    stored_config = core.read_namespaced_config_map("hai-config", NAMESPACE).data["config.toml"]
    assert tomllib.loads(stored_config)["server"]["backend"] == "kubernetes"
    deployment = apps.read_namespaced_deployment("hai-server", NAMESPACE)
    assert (deployment.spec.replicas, deployment.spec.strategy.type) == (1, "Recreate")
    assert deployment.spec.template.spec.service_account_name == SERVICE_ACCOUNT
    # The API server defaulted what the file leaves out and kept what it says.
    container = deployment.spec.template.spec.containers[0]
    assert container.liveness_probe.http_get.path == "/health"
    assert container.security_context.read_only_root_filesystem is True
    service = core.read_namespaced_service("hai", NAMESPACE)
    assert service.spec.type == "ClusterIP" and service.spec.cluster_ip.startswith("10.96.")


@kube
def test_applying_again_changes_nothing_and_rolls_nothing_out(admin: Any, applied: Docs) -> None:
    """`kubectl apply` twice leaves every object as it was, and the Deployment's generation with it (a new
    generation would restart the server). The PVC's resourceVersion alone moves on a 1.20 API server."""
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(admin)

    def stored() -> list[dict[str, Any]]:
        out = []
        for doc in applied:
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            meta = doc["metadata"]
            obj = resource.get(name=meta["name"], namespace=meta.get("namespace")).to_dict()
            obj["metadata"] = {k: obj["metadata"].get(k) for k in ("uid", "generation", "labels")}
            out.append(obj)
        return out

    before = stored()
    apply(admin, applied)
    assert stored() == before


CAN = [
    ("create", "pods", NAMESPACE, ""),
    ("delete", "pods", NAMESPACE, ""),
    ("watch", "pods", NAMESPACE, ""),
    ("list", "pods", NAMESPACE, ""),
    ("patch", "pods", NAMESPACE, ""),
    ("get", "pods/log", NAMESPACE, ""),
    ("create", "pods/exec", NAMESPACE, ""),
    ("create", "services", NAMESPACE, ""),
    ("delete", "services", NAMESPACE, ""),
    ("create", "mpijobs", NAMESPACE, "kubeflow.org"),
    ("watch", "mpijobs", NAMESPACE, "kubeflow.org"),
    ("list", "nodes", "", ""),
    ("watch", "nodes", "", ""),
]
CANNOT = [
    ("get", "secrets", NAMESPACE, ""),
    ("list", "secrets", NAMESPACE, ""),
    ("create", "pods", "default", ""),
    ("create", "pods", "kube-system", ""),
    ("create", "pods/exec", "kube-system", ""),
    ("delete", "nodes", "", ""),
    ("patch", "nodes", "", ""),
    ("create", "rolebindings", NAMESPACE, "rbac.authorization.k8s.io"),
    ("update", "configmaps", NAMESPACE, ""),
    ("create", "deployments", NAMESPACE, "apps"),
    ("create", "persistentvolumeclaims", NAMESPACE, ""),
]


def allowed(admin: Any, verb: str, resource: str, namespace: str, group: str) -> bool:
    """The API server's own authorizer, asked with a SubjectAccessReview for the server's account."""
    from kubernetes import client

    name, _, sub = resource.partition("/")
    attributes = {"verb": verb, "resource": name, "group": group, "namespace": namespace}
    if sub:
        attributes["subresource"] = sub
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": SA_USER,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        },
    }
    answer = client.AuthorizationV1Api(admin).create_subject_access_review(review)
    return bool(answer.status.allowed)


@kube
def test_the_server_account_may_do_what_the_backend_needs(admin: Any, applied: Docs) -> None:
    refused = [case for case in CAN if not allowed(admin, *case)]
    assert refused == [], f"the backend needs these, and the ServiceAccount may not: {refused}"


@kube
def test_the_server_account_may_not_do_what_it_must_not(admin: Any, applied: Docs) -> None:
    granted = [case for case in CANNOT if allowed(admin, *case)]
    assert granted == [], f"the ServiceAccount holds more than the backend needs: {granted}"


@pytest.fixture
def as_server(kube_apiserver: ApiServer, applied: Docs) -> Iterator[Any]:
    api = as_service_account(kube_apiserver)
    yield api
    api.close()


def parked_pod(name: str) -> dict[str, Any]:
    """A pod bound to a node that does not exist, so no kubelet of the tier ever runs it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": "no-such-node", "containers": [{"name": "c", "image": "hai-ci/none:0"}]},
    }


@kube
def test_as_the_account_pods_and_services_are_made_and_removed_and_nodes_read(as_server: Any) -> None:
    """Real requests under the ServiceAccount's identity, not only the authorizer's opinion."""
    from kubernetes import client, watch

    core = client.CoreV1Api(as_server)
    name = f"hai-deploy-{uuid.uuid4().hex[:6]}"
    created = core.create_namespaced_pod(NAMESPACE, parked_pod(name))
    try:
        assert created.metadata.name == name
        assert name in [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items]
        seen = [
            e["object"].metadata.name
            for e in watch.Watch().stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=1)
        ]
        assert name in seen
        service = {"metadata": {"name": name}, "spec": {"clusterIP": "None", "selector": {"x": name}}}
        core.create_namespaced_service(NAMESPACE, service)
        # A 1.20 API server answers a Service delete with a Status the typed client cannot read.
        core.delete_namespaced_service(name, NAMESPACE, _preload_content=False)
        assert isinstance(core.list_node().items, list)
    finally:
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


@kube
def test_as_the_account_secrets_other_namespaces_and_node_changes_are_refused(
    as_server: Any, admin: Any
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(as_server)
    admin_core = client.CoreV1Api(admin)
    secret = f"hai-deploy-{uuid.uuid4().hex[:6]}"
    admin_core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": secret}, "stringData": {"k": "v"}})
    node = f"hai-deploy-node-{uuid.uuid4().hex[:6]}"
    admin_core.create_node({"metadata": {"name": node}, "spec": {"unschedulable": True}})
    try:
        attempts = {
            "read a Secret": lambda: core.read_namespaced_secret(secret, NAMESPACE),
            "list Secrets": lambda: core.list_namespaced_secret(NAMESPACE),
            "create a pod in default": lambda: core.create_namespaced_pod("default", parked_pod(secret)),
            "delete a node": lambda: core.delete_node(node),
            "label a node": lambda: core.patch_node(node, {"metadata": {"labels": {"x": "y"}}}),
        }
        for what, attempt in attempts.items():
            with pytest.raises(ApiException) as refused:
                attempt()
            assert refused.value.status == 403, f"{what}: {refused.value.status} {refused.value.reason}"
            assert SA_USER in json.loads(refused.value.body)["message"], what
        # Nothing happened: the node is there, unlabelled, and no pod was made in default.
        assert "x" not in (admin_core.read_node(node).metadata.labels or {})
        assert secret not in [p.metadata.name for p in admin_core.list_namespaced_pod("default").items]
    finally:
        admin_core.delete_namespaced_secret(secret, NAMESPACE)
        admin_core.delete_node(node)


@kube
@with_kubectl
def test_kubectl_apply_k_of_the_base_succeeds(
    kube_apiserver: ApiServer, applied: Docs, tmp_path: Path
) -> None:
    """What a user runs, with kubectl's own kustomize: `kubectl apply -k deploy/kubernetes/base`."""
    kubeconfig = kube_apiserver.kubeconfig(ADMIN_TOKEN, tmp_path / "kubeconfig")
    out = kubectl_apply_k(kubeconfig, BASE)
    assert out.count("serverside-applied") == len(applied), out


# ---- the product image ------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the top-level Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_the_dockerfile_builds_the_server_image_with_no_airflow_and_no_torch(docs: Docs) -> None:
    steps = dockerfile_instructions()
    assert steps[0] == ("ARG", "BASE=python:3.11-slim-bookworm")
    assert [a for i, a in steps if i == "FROM"] == ["${BASE}"]
    installs = [a for i, a in steps if i == "RUN" and "pip install" in a]
    assert len(installs) == 1
    (extras,) = re.findall(r"\[([\w,]+)\]", installs[0])
    assert set(extras.split(",")) == {"server", "docker", "kubernetes"}
    assert not re.search(r"airflow|torch|train|\ball\b", installs[0].replace("hai-airflow", ""))
    # Everything it copies exists and is let through by .dockerignore.
    for copied in [a for i, a in steps if i == "COPY"]:
        for path in copied.split()[:-1]:
            assert (REPO / path).exists(), f"the Dockerfile copies {path}, which does not exist"
    # Runs as a numeric non-root user (Kubernetes' runAsNonRoot can check only a number), the one the
    # Deployment names.
    (user,) = [a for i, a in steps if i == "USER"]
    uid, _, gid = user.partition(":")
    pod = one(docs, "Deployment", "hai-server")["spec"]["template"]["spec"]
    assert int(uid) != 0 and (int(uid), int(gid)) == (
        pod["securityContext"]["runAsUser"],
        pod["securityContext"]["runAsGroup"],
    )
    # Serves on the config's port, by default with the config file where the Deployment mounts it.
    port = server_config(docs).server.port
    assert ("EXPOSE", str(port)) in steps
    entrypoint = json.loads(next(a for i, a in steps if i == "ENTRYPOINT"))
    cmd = json.loads(next(a for i, a in steps if i == "CMD"))
    container = server_container(docs)
    assert entrypoint == container["command"] == ["hai"]
    assert cmd == container["args"]


def test_the_build_context_holds_only_what_the_dockerfile_copies() -> None:
    """The root .dockerignore keeps .venv, .git, tests and caches out of `docker build .`."""
    docker = pytest.importorskip("docker", reason="the docker SDK is not installed")
    patterns = [
        ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip() and ln[0] != "#"
    ]
    sent = set(docker.utils.build.exclude_paths(str(REPO), patterns, dockerfile="Dockerfile"))
    assert {"pyproject.toml", "README.md", "Dockerfile", "hai_airflow/__init__.py"} <= sent
    tops = {p.split("/")[0] for p in sent}
    assert tops == {"pyproject.toml", "README.md", "Dockerfile", ".dockerignore", "hai_airflow"}, tops
    assert not [p for p in sent if "__pycache__" in p or p.endswith(".pyc")]


def build_sources_unreachable() -> str | None:
    """Why the build cannot fetch what it installs (git from Debian, the package's dependencies from PyPI)."""
    import urllib.request

    for url, what in (
        ("https://pypi.org/simple/pip/", "the image's pip install"),
        ("http://deb.debian.org/debian/dists/bookworm/Release", "the image's apt-get install git"),
    ):
        try:
            urllib.request.urlopen(url, timeout=10).close()
        except OSError as e:
            return f"{url} cannot be reached from here ({e}); {what} needs it"
    return None


@pytest.fixture(scope="module")
def product_image(docker_engine: Engine) -> str:
    """`docker build .` of the top-level Dockerfile on the tier's engine, from a base made here (no Docker
    Hub): about 1.5 min (apt-get for git, pip install from PyPI through the host network)."""
    reason = build_sources_unreachable()
    if reason:
        pytest.skip(reason)
    try:
        base = python_base_image(docker_engine.client)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"no python base image can be made here: {e}")
    tag = f"hai-ci/hai-product:{uuid.uuid4().hex[:8]}"
    api = docker_engine.client.api  # type: ignore[attr-defined]
    log = []
    for chunk in api.build(
        path=str(REPO), dockerfile="Dockerfile", buildargs={"BASE": base}, tag=tag,
        network_mode="host", rm=True, forcerm=True, decode=True,
    ):  # fmt: skip
        log.append(chunk.get("stream", "") or chunk.get("error", ""))
        assert "error" not in chunk, "".join(log)[-3000:]
    return tag


@pytest.fixture
def cluster_node(admin: Any, applied: Docs) -> Iterator[str]:
    """A GPU node as a kubelet would register it, labelled with its GPU type as the README asks."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    name = f"hai-deploy-gpu-{uuid.uuid4().hex[:6]}"
    allocatable = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}
    core.create_node({"metadata": {"name": name, "labels": {"hai.io/gpu-type": "A100"}}})
    core.patch_node_status(name, {"status": {"capacity": allocatable, "allocatable": allocatable}})
    yield name
    core.delete_node(name)


def in_cluster_files(kube_apiserver: ApiServer, admin: Any, where: Path) -> Path:
    """What the kubelet mounts for the ServiceAccount hai: a token the API server issues (TokenRequest)
    and its CA, at the path the in-cluster config reads."""
    from kubernetes import client

    request = {"spec": {"expirationSeconds": 3600}}
    token = client.CoreV1Api(admin).create_namespaced_service_account_token(
        SERVICE_ACCOUNT, NAMESPACE, request
    )
    where.mkdir(mode=0o755)
    (where / "token").write_text(token.status.token)
    shutil.copyfile(kube_apiserver.ca_file, where / "ca.crt")
    (where / "namespace").write_text(NAMESPACE)
    for f in where.iterdir():
        f.chmod(0o644)
    return where


@slow_docker
def test_the_image_runs_the_deployments_config_in_cluster_as_the_service_account(
    product_image: str, docker_engine: Engine, kube_apiserver: ApiServer, admin: Any, docs: Docs,
    cluster_node: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The built image, started as the Deployment starts it (its command, config, env, non-root, read-only
    root, no capabilities), finds the API server through in-cluster config alone and works as `hai`:
    it lists the nodes, and a submitted job becomes a pod in the namespace; cancelled, the pod goes."""
    from kubernetes import client as k8s

    from hai_airflow.client import HaiClient
    from hai_airflow.spec import CpuJobSpec

    image = docker_engine.client.images.get(product_image)  # type: ignore[attr-defined]
    assert image.attrs["Config"]["User"] == "10001:10001"
    packages = docker_engine.client.containers.run(  # type: ignore[attr-defined]
        product_image, entrypoint=["pip", "list", "--format=json"], remove=True
    )
    installed = {p["name"].lower() for p in json.loads(packages)}
    assert {"hai-airflow", "fastapi", "uvicorn", "psycopg", "kubernetes", "docker"} <= installed
    assert not installed & {"torch", "apache-airflow", "numpy"}, installed

    config_dir = tmp_path / "etc-hai"
    config_dir.mkdir(mode=0o755)
    (config_dir / "config.toml").write_text(one(docs, "ConfigMap", "hai-config")["data"]["config.toml"])
    (config_dir / "config.toml").chmod(0o644)
    nas = tmp_path / "nas"
    (nas / "admin" / "code").mkdir(parents=True)
    for d in (nas, nas / "admin", nas / "admin" / "code"):
        os.chown(d, 10001, 10001)
    secrets = in_cluster_files(kube_apiserver, admin, tmp_path / "serviceaccount")
    container = server_container(docs)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    port = free_port()
    api_port = kube_apiserver.url.rsplit(":", 1)[1]
    token = uuid.uuid4().hex
    args = [*container["args"]]
    args[args.index("--port") + 1] = str(port)  # the host network: pick a free port
    args[args.index("--host") + 1] = "127.0.0.1"
    volumes = {
        str(config_dir): {"bind": "/etc/hai", "mode": "ro"},
        str(nas): {"bind": "/nas", "mode": "rw"},
        str(secrets): {"bind": "/var/run/secrets/kubernetes.io/serviceaccount", "mode": "ro"},
    }
    server = docker_engine.client.containers.run(  # type: ignore[attr-defined]
        product_image, command=args, detach=True, network_mode="host",
        environment={**env, "HAI_ADMIN_TOKEN": token, "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                     "KUBERNETES_SERVICE_PORT": api_port},
        volumes=volumes,
        read_only=True, tmpfs={"/tmp": ""}, cap_drop=["ALL"], security_opt=["no-new-privileges"],
    )  # fmt: skip
    core = k8s.CoreV1Api(admin)
    try:
        hai = HaiClient(f"http://127.0.0.1:{port}", token)
        deadline = time.monotonic() + 90
        while True:
            server.reload()
            assert server.status in ("created", "running"), server.logs().decode()[-3000:]
            try:
                health = hai.health()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no /health in 90 s: {server.logs().decode()[-3000:]}") from None
                time.sleep(0.5)
        assert health["status"] == "ok"
        nodes = {n.name: n for n in hai.nodes()}
        assert (nodes[cluster_node].gpu_type, nodes[cluster_node].gpus) == ("A100", 8), nodes

        spec = CpuJobSpec(
            task_name="deploy-check", code_path="/nas/admin/code", cmd="python3 -c 'print(1)'",
            image="hai-ci/none:0", cpus=1, memory_gb=1,
        )  # fmt: skip
        job = hai.submit(spec)
        selector = f"hai.io/owner=hai,hai.io/job-id={job.id}"

        def pods() -> list[Any]:
            return list(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)

        wait_for(lambda: pods(), f"a pod of job {job.id} in {NAMESPACE}", 60, server)
        (pod,) = pods()
        # The job's pod mounts its code path from the NAS claim of the config, and gets no API token.
        claims = {v.name: v.persistent_volume_claim for v in pod.spec.volumes}
        assert claims["nas"].claim_name == "hai-nas"
        mounts = {v.mount_path: v.sub_path for v in pod.spec.containers[0].volume_mounts if v.name == "nas"}
        assert mounts["/nas/admin/code"] == "admin/code"
        assert pod.spec.automount_service_account_token is False
        hai.cancel(job.id)
        wait_for(
            lambda: not pods() or pods()[0].metadata.deletion_timestamp, "the pod's deletion", 60, server
        )
    finally:
        server.remove(force=True)
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector="hai.io/owner=hai").items:
            core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)


def wait_for(predicate: Any, what: str, timeout: float, server: Any) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout} s: {server.logs().decode()[-3000:]}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the Deployment on a real node ------------------------------------------------------------------


def on_the_test_node(docs: Docs, image: str, port: int, api_port: str) -> Docs:
    """The manifests as an admin of the tier's one-node cluster adapts them: the image built here (never
    pulled), and — as the tier's node has no pod network and no kube-proxy — the node's network, a free
    port on it, and the API server's own address for the in-cluster config."""
    out = json.loads(json.dumps(docs))
    (deployment,) = [d for d in out if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    (container,) = pod["containers"]
    container["image"], container["imagePullPolicy"] = image, "Never"
    container["args"][container["args"].index("--port") + 1] = str(port)
    container["ports"][0]["containerPort"] = port
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
    ]
    return out


@slow_docker
def test_the_deployment_becomes_ready_on_a_real_node(
    kube_node: Cluster, product_image: str, docs: Docs, tmp_path: Path
) -> None:
    """kubectl apply, the Secrets, a NAS: the kubelet runs the built image as the Deployment says (service
    account token, non-root, read-only root), the probes pass, and the server sees the cluster's node."""
    from kubernetes import client as k8s

    from hai_airflow.client import HaiClient

    cluster = kube_node
    admin_client = cluster.admin()
    core, apps = k8s.CoreV1Api(admin_client), k8s.AppsV1Api(admin_client)
    port = free_port()
    api_port = cluster.api.url.rsplit(":", 1)[1]
    token = uuid.uuid4().hex
    nas = tmp_path / "nas"
    nas.mkdir()
    os.chown(nas, 10001, 10001)
    manifests = on_the_test_node(docs, product_image, port, api_port)
    apply(admin_client, manifests[:1])  # the namespace, then what the README has the user create
    for name, key, value in (
        ("hai-admin", "token", token),
        ("hai-database", "url", "sqlite:////nas/hai/hai.db"),
    ):
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": name}, "stringData": {key: value}})
    # The NAS: a hostPath volume for the claim (SQLite is fine on a local disk, not on a real NAS).
    core.create_persistent_volume({
        "metadata": {"name": "hai-deploy-nas"},
        "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": str(nas)}, "claimRef": {"namespace": NAMESPACE, "name": "hai-nas"}},
    })  # fmt: skip
    try:
        apply(admin_client, manifests)

        def available() -> bool:
            status = apps.read_namespaced_deployment("hai-server", NAMESPACE).status
            return bool(status.available_replicas == 1)

        def explain() -> str:
            pods = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=hai-server")
            out = []
            for p in pods.items:
                out.append(f"{p.metadata.name}: {p.status.phase} {p.status.container_statuses}")
                try:
                    out.append(core.read_namespaced_pod_log(p.metadata.name, NAMESPACE, tail_lines=30))
                except Exception as e:
                    out.append(f"(no log: {e})")
            return "\n".join(out) + "\n" + cluster.log_tail("kubelet", 20)

        deadline = time.monotonic() + 120
        while not available():
            assert time.monotonic() < deadline, f"hai-server not available in 120 s:\n{explain()}"
            time.sleep(1)
        (pod,) = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=hai-server").items
        assert pod.spec.service_account_name == SERVICE_ACCOUNT and pod.status.container_statuses[0].ready
        hai = HaiClient(f"http://127.0.0.1:{port}", token)
        assert hai.health()["controller_active"] is True
        nodes = {n.name: n for n in hai.nodes()}
        assert nodes[cluster.node].gpus > 0 and nodes[cluster.node].virtual is False, nodes
        # The server's home is on the NAS, private to the image's user.
        assert (nas / "hai").stat().st_uid == 10001 and (nas / "hai" / "token.key").exists()
    finally:
        apps.delete_namespaced_deployment("hai-server", NAMESPACE, propagation_policy="Foreground")
        deadline = time.monotonic() + 60
        while core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=hai-server").items:
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        core.delete_namespaced_persistent_volume_claim("hai-nas", NAMESPACE)
        core.delete_persistent_volume("hai-deploy-nas")


# ---- the overlays: dev and prod ---------------------------------------------------------------------

AIRFLOW_PEER = ({"kubernetes.io/metadata.name": "airflow"}, {"tier": "airflow"})
INGRESS_PEER = ({"kubernetes.io/metadata.name": "ingress-nginx"}, {"app.kubernetes.io/name": "ingress-nginx"})
"""(namespace labels, pod labels) the prod NetworkPolicy admits; docs/deploy.md names the same."""
JOB_POD_LABELS = {"hai.io/owner": "hai"}
"""The labels the prod NetworkPolicy admits job pods of the namespace hai by (the backend's `owner`)."""


def rendered(overlay: str) -> Docs:
    """`kubectl kustomize deploy/kubernetes/overlays/OVERLAY` (skipped where kubectl is missing)."""
    if KUBECTL is None:
        pytest.skip("no kubectl here (its kustomize renders overlays)")
    return kustomize(OVERLAYS / overlay)


@pytest.fixture(scope="module")
def dev() -> Docs:
    return rendered("dev")


@pytest.fixture(scope="module")
def prod() -> Docs:
    return rendered("prod")


def kinds_and_names(docs: Docs) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def env_of(docs: Docs) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in server_container(docs)["env"]}


def secret_ref(env: dict[str, Any]) -> tuple[str, str]:
    ref = env["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def pod_labels(docs: Docs) -> dict[str, str]:
    return dict(one(docs, "Deployment", "hai-server")["spec"]["template"]["metadata"]["labels"])


def test_each_overlay_is_the_base_and_what_it_adds(docs: Docs, dev: Docs, prod: Docs) -> None:
    base = kinds_and_names(docs)
    assert kinds_and_names(dev) == base | {("PersistentVolumeClaim", "hai-db")}
    assert kinds_and_names(prod) == base | {
        ("PodDisruptionBudget", "hai-server"),
        ("NetworkPolicy", "hai-server"),
    }
    for overlay in (dev, prod):
        assert one(overlay, "ConfigMap", "hai-config") == one(docs, "ConfigMap", "hai-config")
        assert one(overlay, "Role") == one(docs, "Role") and one(overlay, "Service") == one(docs, "Service")
        assert all(d["metadata"].get("namespace", NAMESPACE) == NAMESPACE for d in overlay)
        assert env_of(overlay)["HAI_HOME"] == env_of(docs)["HAI_HOME"]
        assert secret_ref(env_of(overlay)["HAI_ADMIN_TOKEN"]) == ADMIN_SECRET


def test_dev_runs_one_pod_on_sqlite_on_a_volume_of_its_own(dev: Docs) -> None:
    """SQLite's write-ahead log needs a local disk: the database lies on a ReadWriteOnce claim of its
    own, never on the NAS, and no Secret hai-database is needed."""
    spec = one(dev, "Deployment", "hai-server")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    url = env_of(dev)["HAI_DATABASE_URL"]
    assert "valueFrom" not in url and url["value"].startswith("sqlite:////"), url
    database = Path(url["value"].removeprefix("sqlite:///"))
    container = server_container(dev)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    claim = volumes[mounts[str(database.parent)]]["persistentVolumeClaim"]["claimName"]
    assert claim != "hai-nas" and not database.is_relative_to("/nas")
    assert one(dev, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    refs = [secret_ref(e)[0] for e in env_of(dev).values() if "valueFrom" in e]
    assert refs == [ADMIN_SECRET[0]]


def test_prod_runs_two_pods_on_postgresql_from_the_secret_bounded_and_spread(prod: Docs) -> None:
    from kubernetes.utils import parse_quantity

    spec = one(prod, "Deployment", "hai-server")["spec"]
    assert spec["replicas"] == 2
    # A rollout replaces one pod at a time: the other answers and holds or takes the lease.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    env = env_of(prod)
    assert "value" not in env["HAI_DATABASE_URL"]
    assert secret_ref(env["HAI_DATABASE_URL"]) == DATABASE_SECRET
    resources = server_container(prod)["resources"]
    for what in ("cpu", "memory"):
        assert parse_quantity(resources["requests"][what]) <= parse_quantity(resources["limits"][what]), what
    anti_affinity = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels(prod).items()

    pdb = one(prod, "PodDisruptionBudget", "hai-server")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["minAvailable"] == 1 < spec["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(prod).items()


def admits(policy: dict[str, Any], namespace: dict[str, str], pod: dict[str, str], port: str) -> bool:
    """Whether an enforcing CNI lets a pod (its namespace's labels, its labels) reach the selected
    pods' named `port` under this NetworkPolicy (matchLabels selectors only, as the policy uses)."""

    def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
        return selector is not None and selector.get("matchLabels", {}).items() <= labels.items()

    # A peer without a namespaceSelector stands for pods of the policy's own namespace.
    own = {"kubernetes.io/metadata.name": policy["metadata"]["namespace"]}
    for rule in policy["spec"].get("ingress", []):
        ports = [p["port"] for p in rule.get("ports", [])]
        peers = rule.get("from", [])
        admitted = [
            p for p in peers
            if matches(p.get("namespaceSelector"), namespace)
            or ("namespaceSelector" not in p and namespace.items() >= own.items())
        ]  # fmt: skip
        if (not ports or port in ports) and any(matches(p.get("podSelector"), pod) for p in admitted):
            return True
    return False


def test_prod_network_policy_admits_only_airflow_the_ingress_controller_and_jobs_to_the_api_port(
    prod: Docs,
) -> None:
    policy = one(prod, "NetworkPolicy", "hai-server")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels(prod).items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress free: the API server, PostgreSQL
    (named,) = server_container(prod)["ports"]
    assert all(r["ports"] == [{"protocol": "TCP", "port": named["name"]}] for r in policy["spec"]["ingress"])
    peers = [
        (p.get("namespaceSelector", {}).get("matchLabels"), p["podSelector"]["matchLabels"])
        for rule in policy["spec"]["ingress"]
        for p in rule["from"]
    ]
    assert peers == [AIRFLOW_PEER, INGRESS_PEER, (None, JOB_POD_LABELS)]
    scheduler = ({"kubernetes.io/metadata.name": "airflow"}, {"tier": "airflow", "component": "scheduler"})
    hai_ns = {"kubernetes.io/metadata.name": NAMESPACE}
    # A job pod as the backend labels it: its `hai` reaches [server] job_url, the API port.
    owner = m.KubernetesOptions.model_validate(server_config(prod).backend).owner
    job_pod = {m.LABEL_OWNER: owner, m.LABEL_JOB: "7", m.LABEL_INSTANCE: "9", m.LABEL_WORKER: "0"}
    assert {m.LABEL_OWNER: owner} == JOB_POD_LABELS
    assert admits(policy, *scheduler, named["name"])
    assert admits(policy, *INGRESS_PEER, named["name"])
    assert admits(policy, hai_ns, job_pod, named["name"])
    refused = {
        "a job pod's labels in another namespace": ({"kubernetes.io/metadata.name": "default"}, job_pod),
        "an unlabelled pod in hai": (hai_ns, {"app": "x"}),
        "another hai-server pod": (hai_ns, pod_labels(prod)),
        "an untiered pod in airflow": ({"kubernetes.io/metadata.name": "airflow"}, {"app": "x"}),
        "a tier=airflow pod elsewhere": ({"kubernetes.io/metadata.name": "default"}, {"tier": "airflow"}),
    }
    for what, (namespace, labels) in refused.items():
        assert not admits(policy, namespace, labels, named["name"]), what
    assert not admits(policy, *scheduler, "metrics")
    assert not admits(policy, hai_ns, job_pod, "metrics")


def test_the_docs_apply_the_overlays_that_exist() -> None:
    """docs/deploy.md's kubectl commands name paths of this tree, and the labels the policy admits."""
    page = (REPO / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"kubectl apply -k (deploy/kubernetes/\S+)", page))
    assert {"deploy/kubernetes/overlays/dev", "deploy/kubernetes/overlays/prod"} <= named
    mentioned = {p.rstrip("/.") for p in re.findall(r"deploy/kubernetes/[\w./-]*", page)}
    assert [p for p in mentioned if not (REPO / p).exists()] == []
    jobs = ({"kubernetes.io/metadata.name": NAMESPACE}, JOB_POD_LABELS)
    for namespace, labels in (AIRFLOW_PEER, INGRESS_PEER, jobs):
        assert namespace["kubernetes.io/metadata.name"] in page
        assert all(f"{k}={v}" in page for k, v in labels.items()), labels


# ---- the overlays applied with `kubectl apply -k` ----------------------------------------------------


def kubectl_apply_k(kubeconfig: Path, directory: Path, server_side: bool = True) -> str:
    """`kubectl apply -k DIRECTORY` (server-side unless asked not to); its stdout, asserting it succeeded."""
    how = ["--server-side", "--force-conflicts"] if server_side else []
    done = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), "apply", *how, "-k", str(directory)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def serves(admin: Any, api_version: str, kind: str) -> bool:
    """Whether the API server serves this kind at this version."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    try:
        DynamicClient(admin).resources.get(api_version=api_version, kind=kind)
    except ResourceNotFoundError:
        return False
    return True


PDB_BEFORE_1_21 = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {overlay}
patches:
  - target: {{group: policy, version: v1, kind: PodDisruptionBudget}}
    patch: |-
      - op: replace
        path: /apiVersion
        value: policy/v1beta1
"""
"""An overlay of an overlay for an API server older than 1.21, which serves PodDisruptionBudget only as
policy/v1beta1 (the same fields); what a team on such a cluster would keep beside the repository's."""


def as_this_server_takes_it(admin: Any, overlay: Path, where: Path) -> Path:
    """The overlay itself, or on an API server without policy/v1 (the tier's Debian 1.20) the overlay
    of it above that only moves its PodDisruptionBudget to policy/v1beta1."""
    if serves(admin, "policy/v1", "PodDisruptionBudget"):
        return overlay
    where.mkdir()
    (where / "kustomization.yaml").write_text(PDB_BEFORE_1_21.format(overlay=os.path.relpath(overlay, where)))
    return where


def without_the_deployment(admin: Any) -> None:
    """Delete hai-server, so an overlay's apply starts from no Deployment: the env entry the base set from
    a Secret and dev from a value must not merge into one with both."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.AppsV1Api(admin).delete_namespaced_deployment("hai-server", NAMESPACE, grace_period_seconds=0)
    except ApiException as e:
        assert e.status == 404, e


@pytest.fixture
def overlays_then_base(admin: Any, docs: Docs) -> Iterator[None]:
    """After an overlay's test: the base as the module's `applied` left it, without the overlay's extras."""
    from kubernetes import client

    yield
    without_the_deployment(admin)
    from kubernetes.dynamic import DynamicClient

    core, policy = client.CoreV1Api(admin), client.NetworkingV1Api(admin)
    pdbs = [
        DynamicClient(admin).resources.get(api_version=version, kind="PodDisruptionBudget")
        for version in ("policy/v1", "policy/v1beta1")
        if serves(admin, version, "PodDisruptionBudget")
    ]
    for delete in (
        lambda: core.delete_namespaced_persistent_volume_claim("hai-db", NAMESPACE),
        lambda: policy.delete_namespaced_network_policy("hai-server", NAMESPACE),
        lambda: pdbs[0].delete(name="hai-server", namespace=NAMESPACE),
    ):
        try:
            delete()
        except client.exceptions.ApiException as e:
            assert e.status == 404, e
    apply(admin, docs)


@kube
@with_kubectl
@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_kubectl_apply_k_of_each_overlay_stores_what_it_renders(
    kube_apiserver: ApiServer, admin: Any, applied: Docs, overlays_then_base: None, overlay: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`kubectl apply -k deploy/kubernetes/overlays/OVERLAY` as a user runs it (client-side apply), read
    back: the Deployment's replicas and database, and prod's PodDisruptionBudget and NetworkPolicy. The
    tier's node does not enforce NetworkPolicy (no CNI here): the API server accepts and keeps it."""
    from kubernetes import client
    from kubernetes.dynamic import DynamicClient

    kubeconfig = kube_apiserver.kubeconfig(ADMIN_TOKEN, tmp_path / "kubeconfig")
    expected = rendered(overlay)
    without_the_deployment(admin)
    directory = as_this_server_takes_it(admin, OVERLAYS / overlay, tmp_path / "older-api-server")
    out = kubectl_apply_k(kubeconfig, directory, server_side=False)
    assert len(out.strip().splitlines()) == len(expected), out

    deployment = client.AppsV1Api(admin).read_namespaced_deployment("hai-server", NAMESPACE)
    wanted = one(expected, "Deployment", "hai-server")["spec"]
    assert deployment.spec.replicas == wanted["replicas"]
    assert deployment.spec.strategy.type == wanted["strategy"]["type"]
    (container,) = deployment.spec.template.spec.containers
    url = {e.name: e for e in container.env}["HAI_DATABASE_URL"]
    if overlay == "dev":
        assert url.value_from is None and url.value.startswith("sqlite:////")
        claim = client.CoreV1Api(admin).read_namespaced_persistent_volume_claim("hai-db", NAMESPACE)
        assert claim.spec.access_modes == ["ReadWriteOnce"]
        return
    ref = url.value_from.secret_key_ref
    assert (ref.name, ref.key) == DATABASE_SECRET and url.value is None
    version = one(kustomize(directory), "PodDisruptionBudget")["apiVersion"]
    pdbs = DynamicClient(admin).resources.get(api_version=version, kind="PodDisruptionBudget")
    pdb = pdbs.get(name="hai-server", namespace=NAMESPACE).to_dict()
    assert pdb["spec"] == one(expected, "PodDisruptionBudget", "hai-server")["spec"]
    stored = client.NetworkingV1Api(admin).read_namespaced_network_policy("hai-server", NAMESPACE)
    assert admin.sanitize_for_serialization(stored)["spec"] == one(expected, "NetworkPolicy")["spec"]


# ---- prod's two replicas on a real node: a controller and a standby that takes over ------------------

SERVE_ON_A_FREE_PORT = (
    "port=$(python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
    'print(s.getsockname()[1])"); echo "$port" > /tmp/port; exec hai "$@"'
)
PROBE_THE_PORT = [
    "python3", "-c",
    "import urllib.request; port = open('/tmp/port').read().strip(); "
    "urllib.request.urlopen(f'http://127.0.0.1:{port}/health', timeout=4)",
]  # fmt: skip


def prod_on_the_test_node(prod: Docs, image: str, api_port: str, pdb_version: str) -> Docs:
    """The prod overlay as an admin of the tier's one-node cluster adapts it, beyond what
    `on_the_test_node` says: on one node's network two pods cannot both listen on 8765 (the scheduler
    counts a host-network port as a hostPort), so each serves on a free port it writes to /tmp/port,
    probed by an exec of the same request; jobs use the host network too; requests fit the
    node's CPUs; the PodDisruptionBudget at the version this API server serves."""
    out = json.loads(json.dumps(prod))
    deployment = one(out, "Deployment", "hai-server")
    pod = deployment["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    (container,) = pod["containers"]
    args = container["args"]
    args[args.index("--port") + 1], args[args.index("--host") + 1] = "$port", "127.0.0.1"
    container["command"] = ["sh", "-c", SERVE_ON_A_FREE_PORT.replace('"$@"', " ".join(args)), "hai"]
    container["args"] = []
    container["image"], container["imagePullPolicy"] = image, "Never"
    del container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        del container[probe]["httpGet"]
        container[probe]["exec"] = {"command": PROBE_THE_PORT}
    container["resources"]["requests"] = {"cpu": "100m", "memory": "256Mi"}
    container["env"] += [
        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
        {"name": "KUBERNETES_SERVICE_PORT", "value": api_port},
    ]
    config = one(out, "ConfigMap", "hai-config")["data"]
    config["config.toml"] = config["config.toml"].replace("[backend]\n", '[backend]\nnetwork = "host"\n', 1)
    one(out, "PodDisruptionBudget", "hai-server")["apiVersion"] = pdb_version
    return out


def server_pods(core: Any) -> list[Any]:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=hai-server").items
    return [p for p in pods if not p.metadata.deletion_timestamp]


def hai_of(engine: Engine, pod: Any, token: str) -> Any:
    """A client of the server in this pod, at the port it wrote to /tmp/port: read from its container on
    the node's engine, not from the pod's log (a second kubelet on the same machine, as when two test
    sessions run, removes the other's /var/log/pods entries)."""
    from hai_airflow.client import HaiClient

    container_id = pod.status.container_statuses[0].container_id.removeprefix("docker://")
    container = engine.client.containers.get(container_id)  # type: ignore[attr-defined]
    code, out = container.exec_run(["cat", "/tmp/port"])
    assert code == 0 and out.strip().isdigit(), f"{pod.metadata.name} wrote no port: {code} {out!r}"
    return HaiClient(f"http://127.0.0.1:{int(out)}", token)


def roles(core: Any, engine: Engine, token: str) -> dict[str, bool]:
    """Each ready hai-server pod: whether its controller holds the lease."""
    out = {}
    for pod in server_pods(core):
        statuses = pod.status.container_statuses or []
        if statuses and statuses[0].ready:
            out[pod.metadata.name] = bool(hai_of(engine, pod, token).health()["controller_active"])
    return out


@pytest.fixture
def prod_store() -> Iterator[str]:
    """A fresh database on the machine's PostgreSQL (127.0.0.1:5432, trust), dropped afterwards."""
    from tests.support import postgres

    reason = postgres.unavailable_reason()
    if reason:
        pytest.skip(reason)
    with postgres.temporary_database("hai_deploy_prod") as url:
        yield url


def until(predicate: Any, what: str, timeout: float, explain: Any) -> Any:
    """The predicate's first true answer within `timeout` s, else a failure saying what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = predicate()
        except Exception as e:  # a pod between states, a server not answering yet
            answer = None
            last = e
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what} did not happen in {timeout} s ({locals().get('last')}):\n{explain()}"
            )
        time.sleep(1)


def deploy_prod_on_the_node(cluster: Cluster, manifests: Docs, url: str, token: str, nas: Path) -> None:
    """What the prod overlay's comments have the user do first (the namespace, its two Secrets, the
    store's URL naming the fresh PostgreSQL database), a hostPath volume for the NAS claim, the rest."""
    from kubernetes import client as k8s

    admin_client = cluster.admin()
    apply(admin_client, manifests[:1])
    secrets = [(ADMIN_SECRET, token), (DATABASE_SECRET, url)]
    apply(admin_client, [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NAMESPACE},
         "stringData": {key: value}}
        for (name, key), value in secrets
    ])  # fmt: skip
    core = k8s.CoreV1Api(admin_client)

    def no_earlier_nas_claim() -> bool:  # the base's node test deletes its hai-nas just before
        return all(
            c.metadata.name != "hai-nas"
            for c in core.list_namespaced_persistent_volume_claim(NAMESPACE).items
        )

    until(no_earlier_nas_claim, "the earlier claim hai-nas gone", 60, str)
    core.create_persistent_volume({
        "metadata": {"name": "hai-deploy-prod-nas"},
        "spec": {"capacity": {"storage": "1Ti"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": str(nas)}, "claimRef": {"namespace": NAMESPACE, "name": "hai-nas"}},
    })  # fmt: skip
    apply(admin_client, manifests[1:])


def undeploy_prod(cluster: Cluster, manifests: Docs) -> None:
    """The Deployment and its pods gone, then what else the prod test made, jobs' pods included."""
    from kubernetes import client as k8s
    from kubernetes.dynamic import DynamicClient

    admin_client = cluster.admin()
    core = k8s.CoreV1Api(admin_client)
    k8s.AppsV1Api(admin_client).delete_namespaced_deployment("hai-server", NAMESPACE)
    deadline = time.monotonic() + 60
    while core.list_namespaced_pod(NAMESPACE).items and time.monotonic() < deadline:
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector="hai.io/owner=hai").items:
            core.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        time.sleep(1)
    dynamic = DynamicClient(admin_client)
    for doc in manifests:
        if doc["kind"] in ("PodDisruptionBudget", "NetworkPolicy", "PersistentVolumeClaim"):
            resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            resource.delete(name=doc["metadata"]["name"], namespace=NAMESPACE)
    core.delete_persistent_volume("hai-deploy-prod-nas")


def one_controller(core: Any, engine: Engine, token: str) -> dict[str, bool] | None:
    """Two ready hai-server pods, exactly one of them holding the lease: their roles, else None."""
    held = roles(core, engine, token)
    return held if len(held) == 2 and sum(held.values()) == 1 else None


@slow_docker
def test_prod_runs_a_controller_and_a_standby_that_takes_over_when_the_leader_pod_is_deleted(
    kube_node: Cluster, docker_engine: Engine, product_image: str, busybox_image: str, prod: Docs,
    prod_store: str, tmp_path: Path,
) -> None:  # fmt: skip
    """The prod overlay's two replicas on the fresh PostgreSQL database: one controller, one standby. A job
    submitted through the standby runs; `kubectl delete pod` of the leader, the standby takes the lease,
    the replacement pod becomes the standby, and the job is still the same running instance and pod,
    which the new controller then cancels. NetworkPolicy is not enforced on this node (no CNI)."""
    from kubernetes import client as k8s

    from hai_airflow.spec import CpuJobSpec

    cluster, token, nas = kube_node, uuid.uuid4().hex, tmp_path / "nas"
    core = k8s.CoreV1Api(cluster.admin())
    (nas / "admin" / "code").mkdir(parents=True)
    for d in (nas, nas / "admin", nas / "admin" / "code"):
        os.chown(d, 10001, 10001)
    pdb = "policy/v1" if serves(cluster.admin(), "policy/v1", "PodDisruptionBudget") else "policy/v1beta1"
    manifests = prod_on_the_test_node(prod, product_image, cluster.api.url.rsplit(":", 1)[1], pdb)

    def explain() -> str:
        out = [
            f"{p.metadata.name}: {p.status.phase} {p.status.container_statuses}" for p in server_pods(core)
        ]
        return "\n".join(out) + "\n" + cluster.log_tail("kubelet", 20)

    deploy_prod_on_the_node(cluster, manifests, prod_store, token, nas)
    try:
        before = until(
            lambda: one_controller(core, docker_engine, token), "a controller and a standby", 240, explain
        )
        (leader,), (standby,) = [[n for n, held in before.items() if held is want] for want in (True, False)]
        hai = hai_of(docker_engine, {p.metadata.name: p for p in server_pods(core)}[standby], token)
        spec = CpuJobSpec(task_name="failover", code_path="/nas/admin/code", cmd="sleep 600",
                          image=busybox_image, cpus=0.2, memory_gb=0.25)  # fmt: skip
        job = hai.submit(spec)
        until(lambda: hai.job(job.id).state == "RUNNING", f"job {job.id} running", 120, explain)
        selector = f"hai.io/owner=hai,hai.io/job-id={job.id}"
        (job_pod,) = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        instances = [i.id for i in hai.instances(job.id)]

        kubeconfig = cluster.api.kubeconfig(ADMIN_TOKEN, tmp_path / "kubeconfig")
        deleted = subprocess.run(
            [str(KUBECTL or "kubectl"), "--kubeconfig", str(kubeconfig), "-n", NAMESPACE,
             "delete", "pod", leader],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert deleted.returncode == 0, deleted.stderr
        until(lambda: hai.health()["controller_active"], "the standby taking the lease", 60, explain)
        after = until(
            lambda: (r := one_controller(core, docker_engine, token)) and leader not in r and r,
            "a new standby",
            180,
            explain,
        )
        assert after[standby] is True, after

        # The job submitted before is accounted for: the same instance, in the same pod, still running.
        assert hai.job(job.id).state == "RUNNING"
        assert [i.id for i in hai.instances(job.id)] == instances
        (same,) = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        assert same.metadata.uid == job_pod.metadata.uid
        hai.cancel(job.id)
        until(lambda: hai.job(job.id).state == "CANCELLED", f"job {job.id} cancelled", 60, explain)
        until(
            lambda: all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod(
                NAMESPACE, label_selector=selector).items),
            "the job's pod deleted by the new controller", 60, explain,
        )  # fmt: skip
    finally:
        undeploy_prod(cluster, manifests)
