"""The hai Airflow plugin for deployments that load plugins from `plugins_folder`."""

from importlib.metadata import entry_points

# With the package's `airflow.plugins` entry point installed, Airflow already loads the plugin;
# defining it here too would register it twice.
if not any(ep.value.startswith("hai_airflow.") for ep in entry_points(group="airflow.plugins")):
    from hai_airflow.airflow_plugin.plugin import HaiPlugin

    __all__ = ["HaiPlugin"]
