"""The docker backend: one container per worker on one Docker engine."""
