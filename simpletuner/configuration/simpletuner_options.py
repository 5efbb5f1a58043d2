"""SimpleTuner's option names and values, and what each means here.

A SimpleTuner user's config.json and multidatabackend.json are full of SimpleTuner's keys.
Reporting them as typos ("did you mean 'model_type'?" for ``loss_type``) sends people the wrong
way, so every SimpleTuner option is one of: a field here (options.py, datasets.py), possibly under
another name (aliases); accepted because its value asks for nothing or it changes nothing here;
or refused by name with what to do instead (simpletuner_keys/ for config.json, the tables below
for multidatabackend.json). The tables are only consulted for keys and values the dataclasses
reject: an option that becomes supported takes over by becoming a field (a test keeps them
disjoint).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from simpletuner.configuration.simpletuner_keys import CONFIG_KEYS
from simpletuner.configuration.simpletuner_keys.datasets import DATASET_KEYS
from simpletuner.configuration.simpletuner_keys.entries import Foreign, same_value
from simpletuner.configuration.simpletuner_keys.values import (
    CONFIG_ALIASES, CONFIG_DIFFERENT, CONFIG_NOT_SET, CONFIG_VALUE_ALIASES, CONFIG_VALUES,
)

DROP = "remove it"

_DATASET_KEYS: dict[str, str] = {
    "vae_cache_clear_each_epoch": "remove it; latents are cached once and reused",
    "caption_filter_list": "remove it; edit the captions themselves",
    "disable_validation": DROP,
    "ignore_epochs": DROP,
}

_DATASET_VALUES: dict[str, dict[str, str]] = {
    "dataset_type": {name: "this dataset type is not supported here; remove the entry"
                     for name in ("audio",)},
    "conditioning_type": {
        **{name: "only reference images, loss masks and ControlNet control images are "
                 "supported; use 'reference_strict' for an edit model (model_flavour 'kontext'), "
                 "'mask' for masked loss, 'controlnet' with controlnet: true, or remove the "
                 "conditioning dataset"
           for name in ("segmentation", "canny", "depth", "inpainting")}},
    "caption_strategy": {"csv": "use 'textfile' (a .txt beside each image)"},
    "crop_style": {"face": "use 'center', 'random' or 'corner'"},
}

_DATASET_DIFFERENT: dict[str, str] = {
    "cache_dir": "on an image dataset here it is the folder of that dataset's text-embedding "
                 "cache (SimpleTuner sets it on the text_embeds entry, which is accepted too)",
    "maximum_image_size": "alone it skips larger images here; SimpleTuner requires "
                          "target_downsample_size with it (and then both mean the same here)",
    "probability": "weighs as data_backend_sampling says: uniform, a dataset with odds p among "
                   "those not yet exhausted, as SimpleTuner; auto-weighting (the default), "
                   "each of its remaining steps with odds p (SimpleTuner: p x its size, its "
                   "remaining steps here), so with equal probabilities datasets mix in "
                   "proportion to their size",
}


@dataclass(frozen=True)
class SimpleTunerVocabulary:
    """SimpleTuner's names for one file and what each means here."""

    unsupported_keys: dict[str, Foreign]
    unsupported_values: dict[str, dict[str, str]]
    different_meaning: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    value_aliases: dict[str, dict[Any, Any]] = field(default_factory=dict)
    not_set: dict[str, tuple] = field(default_factory=dict)

    def canonical(self, key: str) -> str:
        return self.aliases.get(key, key)

    def canonical_value(self, key: str, value: Any) -> Any:
        """SimpleTuner's value of the same meaning -> this option's value."""
        aliases = self.value_aliases.get(key, {})
        return aliases.get(value, value) if isinstance(value, (str, int, float)) else value

    def means_not_set(self, key: str, value: Any) -> bool:
        """SimpleTuner's "not set" (num_train_epochs 0): the option keeps its default here."""
        return any(same_value(value, unset) for unset in self.not_set.get(key, ()))

    def accepts_foreign(self, key: str, value: Any) -> bool:
        """A SimpleTuner option with no field here, whose value asks for nothing here."""
        entry = self.unsupported_keys.get(key)
        return entry is not None and entry.accepts(value)

    def unsupported_key(self, key: str) -> str | None:
        entry = self.unsupported_keys.get(key)
        if entry is None:
            return None
        accepted = ""
        if entry.inert:
            accepted = " (accepted as " + " or ".join(json.dumps(v) for v in entry.inert) + ")"
        return f"SimpleTuner option '{key}' is not supported here{accepted}; {entry.advice}"

    def unsupported_value(self, key: str, value: object) -> str | None:
        advice = self.unsupported_values.get(key, {}).get(value) if isinstance(value, str) else None
        if advice is None:
            return None
        return f"SimpleTuner's {key} '{value}' is not supported here; {advice}"

    def meaning_note(self, key: str) -> str:
        note = self.different_meaning.get(key)
        return f" (differs from SimpleTuner: {note})" if note else ""


CONFIG_JSON = SimpleTunerVocabulary(CONFIG_KEYS, CONFIG_VALUES, CONFIG_DIFFERENT, CONFIG_ALIASES,
                                    CONFIG_VALUE_ALIASES, CONFIG_NOT_SET)
MULTIDATABACKEND_JSON = SimpleTunerVocabulary(
    {**{key: Foreign(advice) for key, advice in _DATASET_KEYS.items()}, **DATASET_KEYS},
    _DATASET_VALUES, _DATASET_DIFFERENT,
    aliases={"disable": "disabled", "is_regularization_data": "is_regularisation_data",
             "instance_data_root": "instance_data_dir"})
