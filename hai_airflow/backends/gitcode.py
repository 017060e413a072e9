"""Fresh checkouts of a job's git repository and branch with the `git` command."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class CheckoutError(Exception):
    """The repository or branch could not be checked out; the message carries git's own words."""


def checkout(url: str, branch: str | None, dest: Path, timeout: float = 600) -> Path:
    """Clone `branch` (default: the repository's default branch) of `url` into the empty `dest`."""
    if dest.exists():
        # A retried start of the same instance must not run code left from an earlier attempt.
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["git", "clone", "--quiet", "--depth", "1", "--single-branch"]
    if branch:
        cmd += ["--branch", branch]
    cmd += ["--", url, str(dest)]
    # Never wait for a password prompt: a job start must fail with a message instead.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true"}
    what = f"git clone of {url}" + (f" (branch {branch})" if branch else "")
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise CheckoutError(f"{what} failed: the git command is not installed") from None
    except subprocess.TimeoutExpired:
        raise CheckoutError(f"{what} failed: no result after {timeout:g} s") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        # Warnings (e.g. --depth ignored for a local path) would bury the error itself.
        message = " ".join([x for x in lines if not x.startswith("warning:")] or lines)
        raise CheckoutError(f"{what} failed: {message or f'exit code {done.returncode}'}")
    return dest
