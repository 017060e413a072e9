"""A job file's keys: `hai create`'s flags, as written (`time-limit`) or with `_` (`time_limit`), each
value read as its flag reads it (`time_limit: 10m`, `array: 0-3%2`); the table of them the docs show."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hai_airflow.cli import flagtable
from hai_airflow.vocabulary import FIELD_FLAGS

NOT_IN_A_FILE = frozenset({"client_key", "wait", "wait_timeout", "output", "as_json", "no_headers"})
"""`hai create` flags that say how to submit and print, not what the task is: given beside -f."""
KEYS: dict[str, flagtable.Flag] = {
    f.dest: f for f in flagtable.COMMANDS["create"].flags if f.dest not in NOT_IN_A_FILE
}
"""Every key a job file takes, by its name with `_`, in `hai create --help`'s order."""
HINTS = {
    **{spec_field: key for spec_field, key in FIELD_FLAGS.items()},
    **{other.replace("-", "_"): name.replace("-", "_") for other, name in flagtable.FLAG_SPELLINGS.items()},
}
"""Names a file may hold by habit (the API's `time_limit_seconds`, `hai submit`'s `name`), and the key."""


@dataclass
class FileValues:
    """A file's keys as `hai create`'s flag values (by dest), where each key was written, and the
    problems found, each with the key as written."""

    values: dict[str, Any] = field(default_factory=lambda: {dest: None for dest in KEYS})
    written: dict[str, str] = field(default_factory=dict)
    problems: list[tuple[str, str]] = field(default_factory=list)


def key_name(key: str) -> str:
    """`time-limit` and `time_limit` are one key."""
    return key.strip().replace("-", "_")


def unknown_key(key: str) -> str:
    """What to say about a key that is no flag of `hai create`: the near one, else where they are."""
    name = key_name(key)
    near = HINTS.get(name) or next(iter(difflib.get_close_matches(name, KEYS, n=1)), None)
    if near is not None:
        return f"{key} is not a job-file key. Did you mean {near}?"
    return (
        f"{key} is not a job-file key. The keys are `hai create`'s flags without the dashes "
        "(see `hai create --help`)"
    )


def read_value(flag: flagtable.Flag, value: Any) -> Any:
    """A key's value as its flag's: text is read as the command line reads it; YAML's own numbers,
    lists and mappings stand for what they are. ValueError saying what is wrong."""
    if value is None:
        return None
    if flag.kind == flagtable.BOOL:
        if not isinstance(value, bool):
            raise ValueError("give true or false")
        return value
    if flag.kind == flagtable.TEXTS and isinstance(value, Mapping | list):
        return value
    if flag.kind == flagtable.TEXTS:
        return [str(value)]
    if isinstance(value, bool):
        raise ValueError(f"give {flag.metavar or 'a value'}, not {str(value).lower()}")
    if flag.kind in (flagtable.DURATION, flagtable.INDICES, flagtable.CHOICE, flagtable.INT, flagtable.FLOAT):
        return flagtable.read_value(flag, str(value))
    return value


def file_values(data: Mapping[Any, Any]) -> FileValues:
    """The file's mapping as `hai create`'s flag values; an unknown key, a key given twice (as
    `time-limit` and `time_limit`) or a value its flag refuses is a problem, and left out."""
    found = FileValues()
    for key, value in data.items():
        name = key_name(str(key))
        if name not in KEYS:
            found.problems.append((str(key), unknown_key(str(key))))
            continue
        if name in found.written:
            found.problems.append((str(key), f"{key} is given twice (also as {found.written[name]})"))
            continue
        found.written[name] = str(key)
        try:
            found.values[name] = read_value(KEYS[name], value)
        except ValueError as error:
            found.problems.append((str(key), f"{key}: {error}"))
    return found


def field_key(spec_field: str) -> str:
    """The key that sets a spec field: `time_limit` for `time_limit_seconds`."""
    return FIELD_FLAGS.get(spec_field, spec_field)


def _value_form(flag: flagtable.Flag) -> str:
    if flag.kind == flagtable.BOOL:
        return "true or false"
    if flag.kind == flagtable.TEXTS:
        return f"a mapping, or a list of {flag.metavar}"
    return f"`{flag.metavar}`" if flag.metavar else "text"


def keys_table() -> str:
    """The docs' table of job-file keys: each key, its value and its meaning (the flag's help)."""
    rows = ["| key | value | meaning |", "|---|---|---|"]
    for dest, flag in KEYS.items():
        meaning = flag.help.replace("|", "\\|")
        rows.append(f"| `{dest}` | {_value_form(flag).replace('|', chr(92) + '|')} | {meaning} |")
    return "\n".join(rows) + "\n"
