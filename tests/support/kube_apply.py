"""`kubectl apply -f DIR` for the tests: a directory's manifests, applied in order by server-side apply;
and `kubectl kustomize DIR`, what `kubectl apply -k DIR` would apply."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

FIELD_MANAGER = "hai-tests"


def load_manifests(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(file, object) of every document of every *.yaml file, in file-name order as kubectl reads them."""
    out = []
    for path in sorted(directory.glob("*.yaml")):
        out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def load_kustomization(directory: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(file, object) of every document of the files a kustomization.yaml lists under `resources`, in its
    order (a base of plain files: no kustomize needed to read it)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        path = directory / name
        out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k DIRECTORY` applies, as kubectl's built-in kustomize renders them."""
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def apply(api_client: Any, docs: list[dict[str, Any]]) -> list[Any]:
    """Create or update each object in turn (server-side apply, as `kubectl apply --server-side`)."""
    from kubernetes.dynamic import DynamicClient

    dynamic = DynamicClient(api_client)
    applied = []
    for doc in docs:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        applied.append(
            resource.server_side_apply(
                body=doc,
                name=doc["metadata"]["name"],
                namespace=doc["metadata"].get("namespace"),
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
            )
        )
    return applied
