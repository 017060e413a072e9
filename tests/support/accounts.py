"""Real OS accounts for tests that run jobs as their owners (`run_as = "{user}"`): made with useradd,
each with a supplementary group of its own, removed afterwards. Needs root, as `run_as` does."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Account:
    """An OS account made for these tests, with a supplementary group of its own."""

    name: str
    uid: int
    gid: int
    extra_gid: int


@contextmanager
def made_account(prefix: str) -> Iterator[Account]:
    """A fresh account named `prefix` and 8 hex digits; the test is skipped where none can be made."""
    if os.geteuid() != 0:
        pytest.skip("run_as needs the test to run as root (it runs jobs as another user)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is missing: the test cannot make an OS account to run jobs as")
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    extra = f"{name}x"
    subprocess.run(["groupadd", extra], check=True, capture_output=True)
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", "-G", extra, name],
        check=True,
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(name)
        extra_gid = int(subprocess.check_output(["getent", "group", extra], text=True).split(":")[2])
        yield Account(name, entry.pw_uid, entry.pw_gid, extra_gid)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", extra], check=False, capture_output=True)
