"""Job files: a job's spec as YAML (`hai task N -o yaml`, the dashboard), and YAML read with its lines."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import TypeAdapter

from hai_airflow import durations
from hai_airflow.spec import JobSpec
from hai_airflow.vocabulary import FIELD_FLAGS

# ---- writing --------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # whole key: fullmatch, never `$` (passes "A\n")
_RESOLVER = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"
_UNSAFE_IN_QUOTES = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")
"""Characters a YAML reader refuses or reads as a line break inside a double-quoted scalar, where
JSON leaves them raw: written as \\u escapes, which both languages share."""


def _yaml_scalar(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return json.dumps(value)
    if isinstance(value, float):
        # YAML 1.1 readers (PyYAML) take `1e-05` for a string: a float needs its dot, `1.0e-05`.
        return re.sub(r"^(-?[0-9]+)(?=e)", r"\1.0", json.dumps(value))
    # A JSON string is a valid YAML double-quoted scalar, so nothing can be misread (yes, 0755, 1e3).
    text = json.dumps(str(value), ensure_ascii=False)
    return _UNSAFE_IN_QUOTES.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _yaml_key(key: str) -> str:
    # Plain only where every reader takes it back as this string: `NO`, `on` or `null` are not.
    plain = (
        _PLAIN_KEY.fullmatch(key)
        and key.lower() not in ("y", "n")
        and _RESOLVER.resolve(yaml.ScalarNode, key, (True, False)) == _STR_TAG
    )
    return key if plain else _yaml_scalar(key)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return [pad + "{}"]
        lines = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{_yaml_key(str(key))}:")
                lines += _yaml_lines(item, indent + 2)
            else:
                lines.append(f"{pad}{_yaml_key(str(key))}: {_yaml_lines(item, 0)[0]}")
        return lines
    if isinstance(value, list):
        if not value:
            return [pad + "[]"]
        lines = []
        for item in value:
            nested = _yaml_lines(item, indent + 2)
            lines.append(f"{pad}- {nested[0].lstrip()}")
            lines += nested[1:]
        return lines
    return [pad + _yaml_scalar(value)]


def to_yaml(payload: Any) -> str:
    """JSON-shaped data as block YAML with every string double-quoted."""
    return "\n".join(_yaml_lines(payload, 0))


_SPEC = TypeAdapter(JobSpec)


def job_file(spec: dict[str, Any]) -> str:
    """A job's spec (as the API returns it) as the YAML `hai create -f` takes: `mode` first, then
    every field of that mode's model, defaults included, so a field added to the spec comes along;
    each under its flag's name with its flag's value (`time_limit: "1h30m"`, not the API's seconds)."""
    fields = _SPEC.validate_python(spec).model_dump(mode="json")
    limit = fields.get("time_limit_seconds")
    if limit is not None:
        fields["time_limit_seconds"] = durations.text(limit)
    keys = {FIELD_FLAGS.get(name, name): value for name, value in fields.items()}
    return to_yaml({"mode": keys.pop("mode"), **keys})


# ---- reading --------------------------------------------------------------------------------


class YamlProblem(ValueError):
    """YAML that cannot be read; `line` (1-based) where the reader knows it."""

    def __init__(self, message: str, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass(frozen=True)
class Document:
    """One YAML document's data, and the line where each key or list item in it starts."""

    data: Any
    lines: dict[tuple[Any, ...], int]
    """Path (keys and list indices, as a pydantic error's `loc`) -> 1-based line."""

    def line_of(self, loc: Sequence[Any]) -> int | None:
        """The line of the deepest part of `loc` the document holds, or None."""
        for end in range(len(loc), 0, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return None


def read_yaml(text: str) -> Document:
    """One YAML document, loaded safely (plain data only); a key given twice in one mapping is refused."""
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            # The lines are taken before construction, which merges `<<:` keys into the nodes.
            lines = _lines(node, (), {}, set()) if node is not None else {}
            return Document(loader.construct_document(node) if node is not None else None, lines)
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        raise YamlProblem(f"character #x{error.character:04x} is not allowed in YAML", line) from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        words = " ".join(str(part) for part in (error.context, error.problem) if part)
        raise YamlProblem(words, mark.line + 1 if mark else None) from None


def _lines(
    node: yaml.Node, path: tuple[Any, ...], lines: dict[tuple[Any, ...], int], seen: set[int]
) -> dict[tuple[Any, ...], int]:
    # An alias is the node it names: walked once, so a file of nested aliases stays cheap to read.
    if id(node) in seen:
        return lines
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            named = isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge"
            here = (*path, key.value if named else None)
            line = key.start_mark.line + 1
            if named and here in lines:
                raise YamlProblem(f"{key.value} is given twice (first on line {lines[here]})", line)
            lines[here] = line
            _lines(value, here, lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _lines(item, (*path, index), lines, seen)
    return lines
