"""The kubernetes backend: pods per worker (or a Kubeflow MPIJob), followed with a watch."""
