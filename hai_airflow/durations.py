"""Durations as people write them (`4h`, `1h30m`, `2d`, `90m`, `1:30:00`, `2-12:00:00`) and as the
platform writes them back (`4h`, `1h30m`): one grammar for every flag, reason and page that takes or
shows a time limit."""

from __future__ import annotations

import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_UNITS = re.compile(r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")
_CLOCK = re.compile(r"(?:(\d+)-)?(\d+):(\d{2}):(\d{2})")

FORMS = "a number with units (4h, 1h30m, 90m, 2d, 45s) or [D-]H:MM:SS (1:30:00, 2-12:00:00)"
"""What `parse` takes, for error messages."""


def parse(text: str) -> int:
    """Seconds in `text`; ValueError naming the forms taken. A bare number is refused: Slurm reads it
    as minutes, and a spec's `*_seconds` field as seconds, so either reading would surprise someone."""
    word = "".join(text.split()).lower()
    if word.isdigit():
        raise ValueError(f"{text!r} has no unit: write {word}m for minutes or {word}s for seconds")
    units = _UNITS.fullmatch(word)
    if word and units:
        return sum(int(n) * UNITS[unit] for unit, n in units.groupdict().items() if n)
    clock = _CLOCK.fullmatch(word)
    if clock:
        days, hours, minutes, seconds = (int(n) if n else 0 for n in clock.groups())
        if minutes < 60 and seconds < 60:
            return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    raise ValueError(f"{text!r} is not a duration: write {FORMS}")


def text(seconds: float) -> str:
    """Whole seconds in the largest units that write them exactly: `4h`, `1h30m`, `2d6h`, `45s`."""
    rest, parts = round(seconds), []
    for unit, size in UNITS.items():
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
