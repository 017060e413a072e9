"""The job credential as a file in the instance's work dir, readable by the job's account alone."""

from __future__ import annotations

import os
from pathlib import Path

from hai_airflow.backends.common.base import Launch, StartError
from hai_airflow.backends.common.jobuser import JobUser
from hai_airflow.backends.common.safefs import trusted_root, write_below

VARIABLE = "HAI_TOKEN_FILE"
"""The variable naming the file; `hai` in the job reads its token there when HAI_TOKEN is unset."""


def write_credential(launch: Launch, account: JobUser | None, home: Path | None) -> None:
    """Write the launch's credential (if it has one) to `launch.credential_path`: 0600, given to
    `account` (None: the server's own, as the job runs). Written through no link the work dir may hold,
    and before any process of the job starts. StartError says why it cannot be."""
    token = launch.job.credential
    if token is None:
        return
    path = launch.credential_path
    try:
        write_below(trusted_root(path, home), path, (token + "\n").encode("ascii"), mode=0o600)
        if account is not None and (account.uid, account.gid) != (os.geteuid(), os.getegid()):
            os.chown(path, account.uid, account.gid, follow_symlinks=False)
    except OSError as e:
        raise StartError(f"cannot write the job credential {path}: {e.strerror or e}") from None


def credential_env(launch: Launch, path: str | None = None) -> dict[str, str]:
    """`HAI_TOKEN_FILE` where the job sees the file (`path`, default the work dir's), set over the job's
    own `env` as the notice is; nothing for a launch without a credential."""
    if launch.job.credential is None:
        return {}
    return {VARIABLE: path or str(launch.credential_path)}
