"""One SimpleTuner option that has no field here, and the helpers that build the tables.

Each is either refused with what to do instead, unless its value asks for nothing here (false,
null, SimpleTuner's "off" value), or accepted with any value because it changes nothing that is
trained here (a worker count, a cache format, an option of a family not supported here).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OFF = (None, False)  # a switch left off, or not set


@dataclass(frozen=True)
class Foreign:
    """``advice``: what to do instead (refused), or why no value changes anything (accepted)."""

    advice: str
    inert: tuple = OFF          # values accepted silently: they ask for nothing
    any_value: bool = False     # every value accepted: the option changes nothing here

    def accepts(self, value: Any) -> bool:
        return self.any_value or any(same_value(value, inert) for inert in self.inert)


def same_value(value: Any, inert: Any) -> bool:
    """Equal with the same JSON type; SimpleTuner's quoted forms ("false", "0", "None") too."""
    if isinstance(value, str) and not isinstance(inert, str):
        text = value.strip()
        if text.lower() == "none":
            return inert is None
        try:
            value = json.loads(text.lower() if text.lower() in ("true", "false", "null")
                               else text)
        except json.JSONDecodeError:
            return False
    if isinstance(value, bool) or isinstance(inert, bool) or value is None or inert is None:
        return value is inert
    if isinstance(value, (int, float)) and isinstance(inert, (int, float)):
        return value == inert
    return type(value) is type(inert) and value == inert


def refused(names: str, advice: str, inert: tuple = OFF) -> dict[str, Foreign]:
    """``names`` (space-separated) refused with ``advice`` unless their value is in ``inert``."""
    return {name: Foreign(advice, tuple(inert)) for name in names.split()}


def ignored(names: str, why: str) -> dict[str, Foreign]:
    """``names`` accepted with any value; ``why`` says why it changes nothing here."""
    return {name: Foreign(why, (), any_value=True) for name in names.split()}
