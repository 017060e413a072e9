"""Provider metadata Airflow reads through the `apache_airflow_provider` entry point."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

INTEGRATION = "HAI"


def _version() -> str:
    try:
        return version("hai-airflow")
    except PackageNotFoundError:
        return "0.0.0"


def get_provider_info() -> dict[str, Any]:
    """Hooks, operators, sensors, triggers, the ``hai`` connection type and the ``[hai]`` options."""
    modules = {
        "hooks": ["hai_airflow.hooks.hai"],
        "operators": [
            "hai_airflow.operators.job",
            "hai_airflow.operators.cpu",
            "hai_airflow.operators.standalone",
            "hai_airflow.operators.distributed",
        ],
        "sensors": ["hai_airflow.sensors.job", "hai_airflow.sensors.checkpoint"],
        "triggers": [
            "hai_airflow.triggers.job",
            "hai_airflow.triggers.quota",
            "hai_airflow.triggers.checkpoint",
        ],
    }
    return {
        "package-name": "hai-airflow",
        "name": "HAI training platform",
        "description": "Run CPU, standalone and distributed training jobs on HAI from Airflow.",
        "versions": [_version()],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["software"]}],
        **{
            kind: [{"integration-name": INTEGRATION, "python-modules": names}]
            for kind, names in modules.items()
        },
        "connection-types": [
            {"connection-type": "hai", "hook-class-name": "hai_airflow.hooks.hai.HaiHook", "hook-name": "HAI"}
        ],
        "config": {
            "hai": {
                "description": "Defaults of the hai operators and the hai plugin.",
                "options": {
                    "default_deferrable": {
                        "description": "Whether hai operators and sensors defer by default when "
                        "[operators] default_deferrable is off.",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": None,
                        "default": "True",
                    },
                    "pool_sync_conn_id": {
                        "description": "Connection the plugin uses to mirror group quotas into "
                        "hai_<group> pools when an Airflow service starts.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": None,
                        "default": "hai_default",
                    },
                },
            }
        },
    }
