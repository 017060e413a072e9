"""The hai Airflow plugin: priority-weight strategy, quota-mirroring pools, queue and quota page."""
