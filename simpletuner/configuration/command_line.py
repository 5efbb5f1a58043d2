"""config.json options given on the command line, as SimpleTuner allows:
``python -m simpletuner.train --config C --max_train_steps 5 --learning_rate 1e-4``.

Each ``--key value`` is read as JSON when it parses as a value the option accepts (numbers,
``true``, ``null``, lists), else as the plain string, so ``--lr_scheduler cosine`` and
``--output_dir 2024`` both mean what they say. A ``--flag`` with no value is ``true``. The values
are then checked by the same code as the file, so a mistake reads the same in either place.
"""

from __future__ import annotations

import json
import typing
from typing import Any

from simpletuner.configuration.errors import ConfigError, Problem
from simpletuner.configuration.fields import accepts, normalise_key
from simpletuner.configuration.loader import COMMAND_LINE as WHERE
from simpletuner.configuration.loader import Configuration, load_configuration
from simpletuner.configuration.options import TrainingConfig


def _value(token: str, tp: Any) -> Any:
    try:
        parsed = json.loads(token)
    except json.JSONDecodeError:
        return token
    if tp is None or accepts(parsed, tp) or not accepts(token, tp):
        return parsed
    return token


def parse_override_args(args: list[str]) -> tuple[dict[str, Any], list[Problem]]:
    """``["--max_train_steps", "5", "--use_ema"]`` -> ({"max_train_steps": 5, "use_ema": True},
    problems). Unknown keys are kept so the loader reports them like the file's."""
    hints = typing.get_type_hints(TrainingConfig)
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("--") or token == "--":
            problems.append(WHERE.problem("", f"expected '--option value', found {token!r}"))
            index += 1
            continue
        key, has_inline, inline = normalise_key(token).partition("=")
        if key in values:
            problems.append(WHERE.problem(key, f"option '--{key}' is given twice"))
        if has_inline:
            raw, index = inline, index + 1
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            raw, index = args[index + 1], index + 2
        else:
            values[key] = True
            index += 1
            continue
        values[key] = _value(raw, hints.get(key))
    return values, problems


def load_with_option_args(config_path: str, option_args: list[str]) -> Configuration:
    """The configuration with command-line ``--option value`` pairs applied; ConfigError lists
    every problem of either."""
    overrides, problems = parse_override_args(option_args)
    if problems:
        raise ConfigError(problems)
    return load_configuration(config_path, overrides=overrides)
