"""Real git repositories for tests: a bare origin whose branches hold the files given."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path


def git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def bare_origin(root: Path, branches: dict[str, dict[str, str]]) -> Path:
    """`root/origin.git`, a bare repository with one commit per branch (in order, each from the one
    before) holding the files {name: text}; the first branch is the default."""
    bare = root / "origin.git"
    default = next(iter(branches))
    git("init", "--quiet", "--bare", f"--initial-branch={default}", str(bare), cwd=root)
    work = root / "work"
    git("clone", "--quiet", str(bare), str(work), cwd=root)
    for branch, files in branches.items():
        git("checkout", "--quiet", "-B", branch, cwd=work)
        for name, text in files.items():
            (work / name).write_text(text)
        git("add", *files, cwd=work)
        git("commit", "--quiet", "-m", branch, cwd=work)
        git("push", "--quiet", "origin", branch, cwd=work)
    return bare


@contextlib.contextmanager
def silent_url() -> Iterator[str]:
    """An http:// repository URL on the loopback whose server accepts and never answers: a clone of
    it hangs until it is killed."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        yield f"http://127.0.0.1:{silent.getsockname()[1]}/team/r.git"
