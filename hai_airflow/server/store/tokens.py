"""API tokens at rest: a keyed hash (HMAC-SHA256) under a server key kept outside the database."""

# Why a keyed hash and not a slow one: every request is authenticated, so the lookup must be one
# indexed equality on a value derived from the token alone, and cheap. Generated tokens carry 192
# random bits, so no hash of them can be guessed back; what needs protecting are weak tokens an
# operator typed into the config. The key lives in a 0600 file (not in the store), so a copy of the
# database, a backup or a job that could read it learns nothing it can log in with.

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_BYTES = 32
TOKEN_BYTES = 24
KEY_FILE_NAME = "token.key"
_KEY_CHECK = b"hai-airflow token key check"


def new_token() -> str:
    """A fresh random API token (192 bits, URL-safe)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def token_hash(key: bytes, token: str) -> str:
    """What the store keeps of a token: HMAC-SHA256 under the server key, hex."""
    return hmac.new(key, token.encode("utf-8"), hashlib.sha256).hexdigest()


def same_hash(stored: str, computed: str) -> bool:
    """Compare two token hashes in constant time."""
    return hmac.compare_digest(stored.encode("ascii"), computed.encode("ascii"))


def key_check(key: bytes) -> str:
    """A fingerprint of the key, kept in the store so a server holding another key refuses to start."""
    return hmac.new(key, _KEY_CHECK, hashlib.sha256).hexdigest()


def read_or_create_key(path: Path) -> bytes:
    """The key in `path` (hex); created 0600 with a random key when missing, race-free between servers."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(KEY_BYTES) + "\n")
        try:
            # A link appears whole or not at all: a server starting at the same time reads one key.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    text = path.read_text(encoding="ascii").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path} does not hold a hex key") from None
    if len(key) < 16:
        raise ValueError(f"{path} holds a key of {len(key)} bytes; at least 16 are needed")
    return key
