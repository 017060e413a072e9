"""Backends that run instances, chosen by name; each is imported only when it is used."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from hai_airflow.backends.common.base import Backend

BACKENDS: dict[str, tuple[str, str, str]] = {
    "local": ("hai_airflow.backends.local.backend", "LocalBackend", ""),
    "docker": ("hai_airflow.backends.docker.backend", "DockerBackend", "docker"),
    "kubernetes": ("hai_airflow.backends.kubernetes.backend", "KubernetesBackend", "kubernetes"),
}
"""Backend name -> (module, class, pip extra it needs). A class is called as `cls(options, home)`."""
OPTIONS: dict[str, tuple[str, str]] = {
    "local": ("hai_airflow.backends.local.backend", "LocalOptions"),
    "docker": ("hai_airflow.backends.docker.containers", "DockerOptions"),
    "kubernetes": ("hai_airflow.backends.kubernetes.manifests", "KubernetesOptions"),
}
"""Backend name -> (module, class) of the model its `[backend]` table is validated with: read by
`hai serve --check-config` and the reference pages without reaching an engine or a cluster."""


class BackendUnavailable(ValueError):
    """The configured backend is unknown or cannot be imported here."""


def _known(name: str, table: Mapping[str, Any]) -> None:
    if name not in table:
        known = ", ".join(sorted(table))
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {known}")


def options_model(name: str) -> type[BaseModel]:
    """The `[backend]` options model of backend `name`; `BackendUnavailable` for an unknown name."""
    _known(name, OPTIONS)
    module_name, class_name = OPTIONS[name]
    model: type[BaseModel] = getattr(importlib.import_module(module_name), class_name)
    return model


def load_backend(name: str, options: Mapping[str, Any] | None, home: Path) -> Backend:
    """The backend called `name`, built from its `options` (a mapping from the config file).

    :param name: a key of `BACKENDS` ("local", "docker", "kubernetes").
    :param options: backend-specific settings; unknown keys are refused by the backend.
    :param home: the platform home directory (`$HAI_HOME`).
    """
    _known(name, BACKENDS)
    module_name, class_name, extra = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"; install it with: pip install 'hai-airflow[{extra}]'" if extra else ""
        raise BackendUnavailable(f"backend {name!r} cannot be loaded: {exc}{hint}") from exc
    backend: Backend = getattr(module, class_name)(dict(options or {}), home)
    return backend
