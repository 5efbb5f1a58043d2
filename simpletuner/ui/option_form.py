"""The new-run form's config.json fields, generated from the option registry (the
TrainingConfig dataclass, as `python -m simpletuner options` lists it): each option's input
by its type (a choice for a Literal, true/false for a bool, a number, text, or a JSON value),
its default as the placeholder and its help. The options most runs set come first; the rest
are under "more". An empty input leaves the option unset (its default applies)."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from html import escape
from typing import Literal

from simpletuner.configuration.fields import REQUIRED
from simpletuner.configuration.options import TrainingConfig

# The server sets these to the run's own folder.
SERVER_SET = ("output_dir", "data_backend_config")
COMMON = ("model_family", "pretrained_model_name_or_path", "model_type", "model_flavour",
          "lora_rank", "learning_rate", "lr_scheduler", "optimizer", "train_batch_size",
          "gradient_accumulation_steps", "max_train_steps", "num_train_epochs", "resolution",
          "mixed_precision", "seed", "checkpointing_steps", "validation_steps",
          "validation_prompt", "resume_from_checkpoint")


@dataclass(frozen=True)
class FormOption:
    name: str
    kind: str                 # choice, bool, int, number, text or json
    choices: tuple[str, ...]  # a choice's values
    default: str              # as the placeholder shows it
    help: str


def _kind(tp) -> tuple[str, tuple[str, ...]]:
    args = [arg for arg in typing.get_args(tp) if arg is not type(None)]
    if typing.get_origin(tp) in (typing.Union, type(int | None)) and len(args) == 1:
        tp = args[0]  # Optional[X] is X left empty
    if typing.get_origin(tp) is Literal:
        return "choice", tuple(str(value) for value in typing.get_args(tp))
    return {bool: ("bool", ("true", "false")), int: ("int", ()), float: ("number", ()),
            str: ("text", ())}.get(tp, ("json", ()))


def _default(field: dataclasses.Field) -> str:
    if field.metadata.get(REQUIRED):
        return "required"
    value = (field.default_factory() if field.default_factory is not dataclasses.MISSING
             else field.default)
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def form_options() -> list[FormOption]:
    """Every config.json option the form offers, the common ones first in COMMON's order."""
    hints = typing.get_type_hints(TrainingConfig)
    options = []
    for field in dataclasses.fields(TrainingConfig):
        if field.name in SERVER_SET:
            continue
        kind, choices = _kind(hints[field.name])
        options.append(FormOption(field.name, kind, choices, _default(field),
                                  field.metadata.get("help", "")))
    order = {name: index for index, name in enumerate(COMMON)}
    return sorted(options, key=lambda option: order.get(option.name, len(order)))


def _input(option: FormOption, value) -> str:
    shown = "" if value is None else value if isinstance(value, str) else json.dumps(value)
    if option.choices:
        items = "".join(f'<option value="{escape(choice)}"{" selected" * (choice == shown)}>'
                        f"{escape(choice)}</option>" for choice in option.choices)
        return (f'<select name="{escape(option.name)}" data-kind={option.kind}>'
                f'<option value="">(default {escape(option.default)})</option>{items}</select>')
    return (f'<input name="{escape(option.name)}" data-kind={option.kind} '
            f'value="{escape(shown)}" placeholder="{escape(option.default)}">')


def _row(option: FormOption, value) -> str:
    return (f'<div class=option data-path="{escape(option.name)}"><label>'
            f'<code>{escape(option.name)}</code> {_input(option, value)}</label>'
            f'<small>{escape(option.help)}</small><ul class=problems></ul></div>')


def options_html(values: dict) -> str:
    """The fields, filled from ``values``: the common options, then the rest under "more"."""
    options = form_options()
    common = "".join(_row(option, values.get(option.name)) for option in options
                     if option.name in COMMON)
    more = "".join(_row(option, values.get(option.name)) for option in options
                   if option.name not in COMMON)
    return (f'<fieldset id=options><legend>config.json</legend>{common}'
            f'<details><summary>more options</summary>{more}</details></fieldset>')


def option_names() -> list[str]:
    return [option.name for option in form_options()]
