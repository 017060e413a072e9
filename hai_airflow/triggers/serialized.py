"""How a hai trigger is stored while it waits: its class path and the arguments that make it again."""

from __future__ import annotations

import inspect
from typing import Any

from airflow.triggers.base import BaseTrigger


def serialized(trigger: BaseTrigger) -> tuple[str, dict[str, Any]]:
    """The trigger's class path and its constructor's arguments, each the attribute of the same name
    (the value as the trigger keeps it), so that `cls(**arguments)` makes the same trigger again."""
    cls = type(trigger)
    names = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    return f"{cls.__module__}.{cls.__qualname__}", {name: getattr(trigger, name) for name in names}
