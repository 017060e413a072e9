"""The `hai` CLI as a user runs it against a live server: a subprocess with that user's token."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.live_server import TOKENS, LiveServer

HAI = [sys.executable, "-c", "from hai_airflow.cli.main import app; app(prog_name='hai')"]


def hai(server: LiveServer, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`hai *args` as `user` (token `<user>-token`) against `server`."""
    env = {**os.environ, "HAI_SERVER": server.url, "HAI_TOKEN": TOKENS[user], "HAI_HOME": str(server.home)}
    return subprocess.run([*HAI, *args], env=env, capture_output=True, text=True, timeout=60)
