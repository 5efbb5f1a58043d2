"""Generic checking of a JSON object against a dataclass whose annotations describe each option.

An option is one dataclass field: its annotation gives the accepted type (``int``, ``float``,
``bool``, ``str``, ``Literal[...]``, ``X | None``, ``list[str]``, unions of these), and
``option(...)`` adds range limits and whether it is required. Adding an option is one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from typing import Any, Literal

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.simpletuner_options import SimpleTunerVocabulary

RANGE = "range"
REQUIRED = "required"


def option(default: Any = None, *, minimum: float | None = None, maximum: float | None = None,
           required: bool = False, secret: bool = False, help: str = "") -> Any:
    """A dataclass field carrying the option's limits; ``help`` documents it in one place.
    A list default is copied for each instance (dataclasses refuse a shared mutable default).
    A ``secret`` (a credential) is left out of the dataclass's repr, so logging a config never
    prints it."""
    metadata = {RANGE: (minimum, maximum), REQUIRED: required, "help": help}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata,
                                 repr=not secret)
    return dataclasses.field(default=default, metadata=metadata, repr=not secret)


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp)
        return f"a list, each {type_name(inner)}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            dict: "a JSON object", type(None): "null"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """Return (accepted, value converted to the option's type)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, converted = _coerce(value, arg)
            if ok:
                return True, converted
        return False, None
    if origin is Literal:
        accepted = any(value == a and type(value) is type(a) for a in typing.get_args(tp))
        return accepted, value
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            return False, None
        converted = []
        for item in value:
            ok, item_value = _coerce(item, inner)
            if not ok:
                return False, None
            converted.append(item_value)
        return True, converted
    if tp is type(None):
        return value is None, None
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, None
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, None
        return True, float(value)
    if tp is str:
        return isinstance(value, str), value
    if tp is dict:  # a nested block, checked field by field by its owner
        return isinstance(value, dict), value
    raise TypeError(f"unsupported option type {tp!r}")


def accepts(value: Any, tp: Any) -> bool:
    """Whether ``value`` (as JSON would give it) is valid for an option of type ``tp``."""
    return _coerce(value, tp)[0]


def _literal_choices(tp: Any) -> list[str]:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return [str(v) for v in typing.get_args(tp)]
    if origin in (typing.Union, types.UnionType):
        return [c for arg in typing.get_args(tp) for c in _literal_choices(arg)]
    return []


def did_you_mean(word: str, candidates: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _unknown_key_problem(where: Location, raw_key: str, key: Location, fields: typing.Iterable[str],
                         vocabulary: SimpleTunerVocabulary | None) -> Problem:
    unsupported = vocabulary.unsupported_key(key) if vocabulary else None
    if unsupported:
        return where.problem(key, unsupported)
    # SimpleTuner's names are candidates too: a typo of one should be told its right spelling.
    names = [*fields, *(vocabulary.aliases if vocabulary else ()),
             *(vocabulary.unsupported_keys if vocabulary else ())]
    return where.problem(key, f"unknown key '{raw_key}'{did_you_mean(key, names)}")


def _rejected_value_problem(where: Location, key: Location, value: Any, tp: Any,
                            vocabulary: SimpleTunerVocabulary | None) -> Problem:
    unsupported = vocabulary.unsupported_value(key, value) if vocabulary else None
    if unsupported:
        return where.problem(key, f"key '{key}': {unsupported}")
    choices = _literal_choices(tp)
    hint = did_you_mean(str(value), choices) if isinstance(value, str) and choices else ""
    note = vocabulary.meaning_note(key) if vocabulary else ""
    return where.problem(key, f"key '{key}' is {value!r}; expected {type_name(tp)}{hint}{note}")


def _unquoted(value: Any) -> Any:
    """SimpleTuner reads config.json's values as command-line text, so its files quote numbers
    and booleans ("1e-4", "true", "True"): such a text as the JSON value it spells, else as is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lower() in ("true", "false", "null", "none"):
        return {"true": True, "false": False}.get(text.lower())
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return value
    return parsed if isinstance(parsed, (int, float)) else value


def normalise_key(key: Location) -> str:
    """SimpleTuner's config.json accepts '--train_batch_size' and 'train_batch_size' alike."""
    return key[2:] if key.startswith("--") else key


def parse_fields(cls: type, raw: dict[str, Any], where: Location, problems: list[Problem],
                 vocabulary: SimpleTunerVocabulary | None = None, *,
                 check_required: bool = True) -> dict[str, Any]:
    """Check ``raw`` against ``cls``'s options; append a message per problem to ``problems``.

    Returns the accepted values (unknown or invalid keys are left out) ready for ``cls(**values)``.
    ``where`` is the object's file and JSON path (each problem's path is its key's, by the
    option's name), e.g. ``Location("config/config.json")``. ``vocabulary`` names the
    SimpleTuner keys and values of this file that are not supported here, so they get advice
    instead of a did-you-mean. ``check_required=False`` checks a partial set (overrides).
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    values: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for raw_key, value in raw.items():
        key = normalise_key(raw_key)
        key = vocabulary.canonical(key) if vocabulary else key
        if key in seen:
            first = raw[seen[key]]
            if type(first) is not type(value) or first != value:  # the same value twice is one
                problems.append(where.problem(
                    key, f"key '{key}' is given twice ('{seen[key]}' and '{raw_key}') with "
                    f"different values ({first!r} and {value!r})"))
            continue
        seen[key] = raw_key
        if vocabulary is not None:
            value = vocabulary.canonical_value(key, value)
            if vocabulary.means_not_set(key, value) or (
                    key not in fields and vocabulary.accepts_foreign(key, value)):
                continue  # SimpleTuner's value asks for nothing here
        if key not in fields:
            problems.append(_unknown_key_problem(where, raw_key, key, fields, vocabulary))
            continue
        tp = hints[key]
        ok, converted = _coerce(value, tp)
        if not ok:
            ok, converted = _coerce(_unquoted(value), tp)
        if not ok:
            problems.append(_rejected_value_problem(where, key, value, tp, vocabulary))
            continue
        low, high = fields[key].metadata.get(RANGE, (None, None))
        if isinstance(converted, (int, float)) and not isinstance(converted, bool):
            note = vocabulary.meaning_note(key) if vocabulary else ""
            if low is not None and converted < low:
                problems.append(where.problem(
                    key, f"key '{key}' is {value!r}; expected a value >= {low}{note}"))
                continue
            if high is not None and converted > high:
                problems.append(where.problem(
                    key, f"key '{key}' is {value!r}; expected a value <= {high}{note}"))
                continue
        values[key] = converted
    for name, f in fields.items():
        required = check_required and f.metadata.get(REQUIRED)
        if required and values.get(name) is None and name not in seen:
            problems.append(where.problem(name, f"missing required key '{name}'"))
    return values
