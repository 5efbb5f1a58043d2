"""SimpleTuner's placeholders in multidatabackend.json strings: {model_family}, {output_dir},
{id} (the entry's id) and {env:NAME}. Its examples name cache folders this way
("cache/vae/{model_family}/dreambooth-512"); an unknown {name} stays as written."""

from __future__ import annotations

import os
import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def fill_placeholders(value: Any, variables: dict[str, str]) -> Any:
    """``value`` with every placeholder in its strings, at any depth, replaced."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda match: _replacement(match, variables), value)
    if isinstance(value, list):
        return [fill_placeholders(item, variables) for item in value]
    if isinstance(value, dict):
        return {key: fill_placeholders(item, variables) for key, item in value.items()}
    return value


def _replacement(match: re.Match, variables: dict[str, str]) -> str:
    token = match.group(1)
    if token.startswith("env:"):
        return os.environ.get(token[4:], "")
    return variables.get(token, match.group(0))
