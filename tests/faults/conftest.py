"""The faults tier runs `hai` as a user would, with the CLI tests' isolated home."""

from __future__ import annotations

from tests.cli.conftest import hai, isolated_home

__all__ = ["hai", "isolated_home"]
