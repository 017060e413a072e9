"""Labels on jobs (`--label team=vision`) and selectors over them (`-l team=vision,stage!=eval`), as
Kubernetes users write them. One grammar for the spec, the CLI and the API.

Keys and values are 1-63 characters of letters, digits, `.`, `_` and `-`, starting and ending with a
letter or digit (a value may be empty). A selector is comma-separated requirements: `key=value`
(`==` too), `key!=value`, `key` (has the label) and `!key` (does not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

MAX_LABELS = 32
"""Labels one job may carry."""
PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
KEY_PATTERN = f"^{PART}$"
VALUE_PATTERN = f"^(?:{PART})?$"
KEY = re.compile(PART)
VALUE = re.compile(f"(?:{PART})?")
FORMS = "key=value, key!=value, key or !key, comma-separated"


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Literal["=", "!=", "exists", "absent"]
    value: str = ""


def check_key(key: str) -> str:
    if not KEY.fullmatch(key):
        raise ValueError(
            f"label key {key!r} is not 1-63 letters, digits, '.', '_' or '-', starting and ending "
            "with a letter or digit"
        )
    return key


def check_value(key: str, value: str) -> str:
    if not VALUE.fullmatch(value):
        raise ValueError(f"label {key}: value {value!r} is not up to 63 letters, digits, '.', '_' or '-'")
    return value


def parse_pairs(pairs: list[str]) -> dict[str, str]:
    """`key=value` strings (repeatable flags) as labels; ValueError naming the bad one."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"label {pair!r} is not key=value")
        labels[check_key(key.strip())] = check_value(key, value.strip())
    return labels


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A selector's requirements; ValueError naming the bad one and the forms taken."""
    found = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            found.append(_requirement(part))
        except ValueError as error:
            raise ValueError(f"{error}; a selector is {FORMS}") from None
    if not found:
        raise ValueError(f"the selector is empty; a selector is {FORMS}")
    return tuple(found)


def _requirement(part: str) -> Requirement:
    for op, sep in (("!=", "!="), ("=", "=="), ("=", "=")):
        if sep in part:
            key, value = (s.strip() for s in part.split(sep, 1))
            return Requirement(check_key(key), op, check_value(key, value))  # type: ignore[arg-type]
    if part.startswith("!"):
        return Requirement(check_key(part[1:].strip()), "absent")
    return Requirement(check_key(part), "exists")


def encode(labels: dict[str, str]) -> str | None:
    """How the store keeps a job's labels, for a selector to match with LIKE: `,k1=v1,k2=v2,` sorted;
    None without labels."""
    if not labels:
        return None
    return "," + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + ","
