"""The hai dashboard: queue, quota, nodes and job pages rendered on the server from the REST API."""
