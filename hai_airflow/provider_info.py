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
    """Hooks, operators, sensors, triggers, the ``hai`` connection type and its form, the job link
    and the ``[hai]`` options."""
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
            {
                "connection-type": "hai",
                "hook-class-name": "hai_airflow.hooks.hai.HaiHook",
                "hook-name": "HAI",
                "conn-fields": {
                    "region": {
                        "label": "Region",
                        "description": "A region of $HAI_HOME/client.toml; used when the host is empty.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "user_map": {
                        "label": "Airflow user -> hai user",
                        "description": "Where an Airflow user name is not the hai user name, e.g. "
                        '{"alice@corp.com": "alice"}; other names are the same on both sides.',
                        "schema": {"type": ["object", "null"]},
                    },
                },
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "port"],
                    "relabeling": {"host": "Server URL", "password": "API token"},
                    "placeholders": {
                        "host": "http://127.0.0.1:8765",
                        "password": "a hai token; a service identity's (acts_for) to act for each person",
                    },
                },
            }
        ],
        "extra-links": ["hai_airflow.dashboard.extra_link.HaiJobLink"],
        "config": {
            "hai": {
                "description": "Defaults of the hai operators and the hai plugin.",
                "options": {
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
