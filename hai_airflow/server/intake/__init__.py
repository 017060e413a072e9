"""Accepting jobs: checking a submit, resolving its resources, applying the quota rule, storing it."""
