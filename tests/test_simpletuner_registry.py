"""Every option of SimpleTuner's registry, and every multidatabackend.json key it documents, is
supported, accepted or refused by name here: never answered with a did-you-mean or as unknown.

The names come from tests/fixtures/simpletuner/ (SimpleTuner 4.10.1's FieldRegistry, its
dataset documentation, and older releases' names; the README there says where each comes
from)."""

from __future__ import annotations

import dataclasses
import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.configuration import ConfigError, DatasetConfig, TrainingConfig, load_configuration
from simpletuner.configuration.embed_entries import EmbedCacheEntry
from simpletuner.configuration.simpletuner_options import CONFIG_JSON, MULTIDATABACKEND_JSON

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "simpletuner"
REGISTRY = json.loads((FIXTURES / "config_options.json").read_text(encoding="utf-8"))["options"]
LEGACY = json.loads((FIXTURES / "legacy_options.json").read_text(encoding="utf-8"))
CONFIG_NAMES = [*REGISTRY, *LEGACY["config_options"]]  # older releases' names too
DATASET_KEYS = [*json.loads((FIXTURES / "dataset_keys.json").read_text(encoding="utf-8"))["keys"],
                *LEGACY["dataset_keys"]]
NOT_A_VALUE = {"surely": "not a value anything asks for"}  # no option takes this object
TYPO_MARKS = ("did you mean", "unknown key")


class RegistryCoverageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls._tmp.name)
        (cls.root / "images").mkdir()
        cls.backend = cls.root / "multidatabackend.json"

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def problems(self, options: dict, dataset_keys: dict | None = None) -> list[str]:
        """The problems of a valid sd1x config plus ``options``; [] when it loads."""
        base = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                "output_dir": "out", "data_backend_config": str(self.backend)}
        config = self.root / "config.json"
        config.write_text(json.dumps({**base, **options}))
        dataset = {"id": "photos", "instance_data_dir": str(self.root / "images"),
                   **(dataset_keys or {})}
        self.backend.write_text(json.dumps([dataset]))
        try:
            load_configuration(config, cwd=self.root)
        except ConfigError as error:
            return error.problems
        return []

    def assert_named(self, key: str, problems: list[str]) -> None:
        """No problem calls ``key`` a typo or unknown."""
        self.assertFalse([p for p in problems if any(m in p for m in TYPO_MARKS)], (key, problems))

    def test_every_registry_option_is_a_field_or_a_known_simpletuner_option(self):
        fields = {f.name for f in dataclasses.fields(TrainingConfig)}
        for name in CONFIG_NAMES:
            canonical = CONFIG_JSON.canonical(name)
            with self.subTest(name=name):
                self.assertTrue(canonical in fields or canonical in CONFIG_JSON.unsupported_keys,
                                f"{name} is neither an option here nor in simpletuner_keys/")

    def test_simpletuners_default_of_every_option_is_accepted_or_refused_by_name(self):
        for name, spec in REGISTRY.items():
            if "alias_of" in spec:
                continue
            with self.subTest(name=name):
                problems = self.problems({name: spec["default"]})
                self.assert_named(name, problems)
                key = CONFIG_JSON.canonical(name)
                if key in CONFIG_JSON.unsupported_keys and problems:
                    self.assertIn(f"SimpleTuner option '{key}' is not supported here",
                                  "\n".join(problems))

    def test_any_other_value_is_refused_by_name_never_as_a_typo(self):
        for name in CONFIG_NAMES:
            with self.subTest(name=name):
                problems = self.problems({name: NOT_A_VALUE})
                self.assert_named(name, problems)
                key = CONFIG_JSON.canonical(name)
                entry = CONFIG_JSON.unsupported_keys.get(key)
                if entry is not None and not entry.any_value:
                    self.assertEqual(len(problems), 1, problems)
                    self.assertIn(f"SimpleTuner option '{key}' is not supported here",
                                  problems[0])
                elif entry is not None:
                    self.assertEqual(problems, [])  # any value: it changes nothing here

    def test_every_choice_of_a_supported_option_is_accepted_or_refused_by_name(self):
        fields = {f.name for f in dataclasses.fields(TrainingConfig)}
        for name, spec in REGISTRY.items():
            key = CONFIG_JSON.canonical(name)
            if key not in fields:
                continue
            for choice in spec.get("choices", []):
                with self.subTest(name=name, choice=choice):
                    problems = self.problems({name: choice})
                    self.assert_named(name, problems)
                    for problem in problems:
                        if f"key '{key}'" in problem and isinstance(choice, str):
                            self.assertIn(f"SimpleTuner's {key} '{choice}' is not supported",
                                          problem)

    def test_every_documented_dataset_key_is_a_field_or_a_known_simpletuner_key(self):
        fields = {f.name for cls in (DatasetConfig, EmbedCacheEntry)
                  for f in dataclasses.fields(cls)}
        for key in DATASET_KEYS:
            canonical = MULTIDATABACKEND_JSON.canonical(key)
            with self.subTest(key=key):
                self.assertTrue(canonical in fields
                                or canonical in MULTIDATABACKEND_JSON.unsupported_keys, key)
                entry = MULTIDATABACKEND_JSON.unsupported_keys.get(canonical)
                if canonical not in fields:
                    problems = self.problems({}, {key: NOT_A_VALUE})
                    self.assert_named(key, problems)
                    if entry.any_value:
                        self.assertEqual(problems, [])
                    else:
                        self.assertIn(f"SimpleTuner option '{canonical}' is not supported here",
                                      "\n".join(problems))

    def test_a_real_typo_still_gets_its_suggestion(self):
        problems = self.problems({"checkpoint_step_intervals": 5})
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("did you mean 'checkpoint_step_interval'", problems[0])


if __name__ == "__main__":
    unittest.main()
