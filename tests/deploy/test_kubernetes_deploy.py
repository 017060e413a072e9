"""deploy/kubernetes/ and the top-level Dockerfile: what a user applies and builds, checked for real.

The manifests are validated against Kubernetes' schemas, applied to the test tier's kube-apiserver, and
the server's ServiceAccount is shown to hold what the kubernetes backend needs and nothing it must not.
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

from hai_airflow.backends import k8s_manifests as m
from hai_airflow.scheduling import POLICIES
from hai_airflow.server.config import ServerConfig, parse_config
from tests.support.docker_engine import Engine, docker_engine
from tests.support.kube_apiserver import ADMIN_TOKEN, ApiServer, kube_apiserver
from tests.support.kube_apply import apply, load_manifests
from tests.support.kube_node import Cluster, kube_node
from tests.support.python_base_image import python_base_image

__all__ = ["docker_engine", "kube_apiserver", "kube_node"]  # the session fixtures used below

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
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


@pytest.fixture(scope="module")
def docs() -> Docs:
    return [doc for _, doc in load_manifests(DEPLOY)]


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
    `python -m hai_airflow.backends.k8s_manifests hai hai > deploy/kubernetes/02-rbac.yaml`."""
    printed = subprocess.run(
        [sys.executable, "-m", "hai_airflow.backends.k8s_manifests", NAMESPACE, SERVICE_ACCOUNT],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert (DEPLOY / "02-rbac.yaml").read_text() == printed.stdout
    assert printed.stdout == m.rbac_yaml(NAMESPACE, SERVICE_ACCOUNT)


def test_files_apply_in_an_order_kubectl_can_follow(docs: Docs) -> None:
    """`kubectl apply -f deploy/kubernetes/` reads files by name: the namespace comes first, every other
    object lives in it (or is cluster-wide RBAC), and nothing but manifests lies there."""
    assert docs[0]["kind"] == "Namespace" and docs[0]["metadata"]["name"] == NAMESPACE
    for doc in docs[1:]:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]
    assert {p.suffix for p in DEPLOY.iterdir()} == {".yaml"}
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted([
        ("Namespace", "hai"), ("ServiceAccount", "hai"),
        ("Role", "hai-server"), ("RoleBinding", "hai-server"),
        ("ClusterRole", "hai-server"), ("ClusterRoleBinding", "hai-server-hai"),
        ("PersistentVolumeClaim", "hai-nas"), ("ConfigMap", "hai-config"), ("Deployment", "hai-server"),
        ("Service", "hai"),
    ])  # fmt: skip


@pytest.mark.skipif(not Path(VALIDATOR).exists(), reason="kubernetes-validate is not installed (dev extra)")
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_manifest_passes_strict_schema_validation(docs: Docs, version: str) -> None:
    files = sorted(str(p) for p in DEPLOY.glob("*.yaml"))
    done = subprocess.run(
        [VALIDATOR, "--strict", "-k", version, *files], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" passed for resource ") == len(docs)


def test_no_secret_is_shipped() -> None:
    """The token and the database URL come from Secrets the user creates; no file holds one."""
    text = "".join(p.read_text() for p in DEPLOY.glob("*.yaml"))
    assert "kind: Secret" not in text and '"kind": "Secret"' not in text
    assert not re.search(r"^\s*token\s*=", text, re.M)
    assert "postgresql+psycopg://" not in text.replace("postgresql+psycopg://hai:PASSWORD@", "")
    create = "kubectl -n hai create secret generic hai-admin --from-literal=token="
    assert create in (DEPLOY / "05-server.yaml").read_text()


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
    """Every manifest applied in file order, as `kubectl apply -f deploy/kubernetes/` does."""
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
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl here (the path users take)")
def test_kubectl_apply_of_the_directory_succeeds(
    kube_apiserver: ApiServer, applied: Docs, tmp_path: Path
) -> None:
    """What a user runs, with kubectl's own parsing of the files: `kubectl apply -f deploy/kubernetes/`."""
    kubeconfig = kube_apiserver.kubeconfig(ADMIN_TOKEN, tmp_path / "kubeconfig")
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), "apply", "--server-side", "--force-conflicts",
         "-f", str(DEPLOY)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("serverside-applied") == len(applied), done.stdout


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
