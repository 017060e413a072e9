"""Job arrays, as Slurm's `--array` writes them: `0-9`, `0-15:4`, `1,3,5`, `0-3,8`, each with an
optional `%K` (at most K of them running at once). One grammar for the CLI, the API and the docs."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_ELEMENTS = 1000
"""Tasks one array may make."""
MAX_INDEX = 1_000_000
"""The highest index, and the longest step, a range may name."""
FORMS = "indices such as 0-9, 0-15:4 or 1,3,5, with %K for at most K at once (0-9%2)"
_DIGITS = len(str(MAX_INDEX))
"""Digits of the largest number the grammar reads: a longer one is refused before it is read."""
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


@dataclass(frozen=True)
class Array:
    indices: tuple[int, ...]
    """The index of each task (`HAI_ARRAY_INDEX`), ascending, each once."""
    limit: int | None
    """At most this many running at once; None: as many as fit."""


def parse(text: str) -> Array:
    """An array's indices and limit; ValueError naming what is wrong and the forms taken."""
    body, sep, limit_text = text.strip().partition("%")
    limit = _limit(limit_text, text) if sep else None
    indices: set[int] = set()
    for part in body.split(","):
        found = _range(part.strip(), text)
        if len(found) > MAX_ELEMENTS or len(indices.union(found)) > MAX_ELEMENTS:
            raise ValueError(f"{text!r} makes more than {MAX_ELEMENTS} tasks; split it into several arrays")
        indices.update(found)
    return Array(tuple(sorted(indices)), limit)


def _limit(limit_text: str, text: str) -> int:
    """The K of `%K`: 1 to MAX_ELEMENTS (an array never runs more tasks than it has)."""
    if re.fullmatch("[0-9]+", limit_text) is None:
        raise ValueError(f"{text!r}: the limit after % must be a number; write {FORMS}")
    limit = int(limit_text) if len(limit_text) <= _DIGITS else MAX_ELEMENTS + 1
    if limit == 0:
        raise ValueError(f"{text!r}: %0 would run none; give %1 or more")
    if limit > MAX_ELEMENTS:
        raise ValueError(f"{text!r}: the limit after % must be 1 to {MAX_ELEMENTS}; write {FORMS}")
    return limit


def _range(part: str, text: str) -> range:
    found = _RANGE.fullmatch(part)
    if found is None:
        raise ValueError(f"{text!r}: {part!r} is not an index or a range; write {FORMS}")
    numbers = [n for n in found.groups() if n is not None]
    if any(len(n) > _DIGITS for n in numbers):
        raise ValueError(f"{text!r}: {part!r} is not a range from low to high (at most {MAX_INDEX:,})")
    first, last, step = int(found[1]), int(found[2] or found[1]), int(found[3] or 1)
    if last < first or step == 0 or last > MAX_INDEX or step > MAX_INDEX:
        raise ValueError(f"{text!r}: {part!r} is not a range from low to high (at most {MAX_INDEX:,})")
    return range(first, last + 1, step)


def describe(array: Array) -> str:
    """`10 tasks (indices 0-9), at most 2 at once`."""
    first, last = array.indices[0], array.indices[-1]
    shown = (
        (f"{first}-{last}" if last > first else str(first))
        if array.indices == tuple(range(first, last + 1))
        else ",".join(map(str, array.indices[:8])) + (",…" if len(array.indices) > 8 else "")
    )
    count = len(array.indices)
    limit = f", at most {array.limit} at once" if array.limit is not None else ""
    return f"{count} task{'s' if count != 1 else ''} (indices {shown}){limit}"
