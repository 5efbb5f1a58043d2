"""config.json options on the command line: typed like the file, validated like the file, and
winning over it; ./train.sh validates them before starting the launcher (training with them
through ./train.sh: test_validation_options)."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.configuration import ConfigError
from simpletuner.configuration.command_line import load_with_option_args, parse_override_args
from launching import REPO, run_bounded
from training_fixtures import environment, make_shapes, write_config


class ParseOverrideArgsTest(unittest.TestCase):
    def test_values_are_typed_by_the_option(self):
        values, problems = parse_override_args(
            ["--max_train_steps", "5", "--learning_rate", "1e-4", "--lr_scheduler", "cosine",
             "--output_dir", "2024", "--use_ema", "--seed=3", "--validation_prompt", "a cat",
             "--lora_target_modules", '["to_q", "to_v"]', "--flow_logit_mean", "-0.5"])
        self.assertEqual(problems, [])
        self.assertEqual(values, {
            "max_train_steps": 5, "learning_rate": 1e-4, "lr_scheduler": "cosine",
            "output_dir": "2024", "use_ema": True, "seed": 3, "validation_prompt": "a cat",
            "lora_target_modules": ["to_q", "to_v"], "flow_logit_mean": -0.5})

    def test_stray_values_and_repeats_are_problems(self):
        _, problems = parse_override_args(["5", "--seed", "1", "--seed", "2"])
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("expected '--option value', found '5'", problems[0].message)
        self.assertEqual((problems[1].file, problems[1].path), ("command line", "seed"))
        self.assertIn("'--seed' is given twice", problems[1].message)


class LoadWithOverridesTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "data").mkdir()
        self.config = write_config(self.root, self.root / "data")
        options = json.loads(self.config.read_text())
        options["--max_train_steps"] = options.pop("max_train_steps")  # SimpleTuner's spelling
        self.config.write_text(json.dumps(options))

    def test_overrides_win_over_the_file_even_with_dashes(self):
        config = load_with_option_args(str(self.config), ["--max_train_steps", "5",
                                                          "--learning_rate", "1e-4"])
        self.assertEqual(config.training.max_train_steps, 5)
        self.assertEqual(config.training.learning_rate, 1e-4)

    def test_overrides_are_validated_and_named_as_the_command_line(self):
        with self.assertRaises(ConfigError) as caught:
            load_with_option_args(str(self.config), [
                "--max_train_steps", "-1", "--learning_rat", "1", "--use_soft_min_snr", "true"])
        problems = caught.exception.problems
        self.assertEqual(len(problems), 3, problems)
        self.assertTrue(problems[0].startswith(
            "command line: key 'max_train_steps' is -1; expected a value >= 1"), problems[0])
        self.assertIn("command line: unknown key 'learning_rat' (did you mean 'learning_rate'?)",
                      problems[1])
        self.assertIn("command line: SimpleTuner option 'use_soft_min_snr' is not supported", problems[2])


class TrainShOverridesTest(unittest.TestCase):
    def test_a_bad_override_stops_train_sh_before_the_launcher_with_status_2(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=2)
            config = write_config(root, root / "data")
            result = run_bounded([REPO / "train.sh", config, "--train_batch_size", "two"],
                                 tmpdir=tmp, env=environment(tmp), timeout=120)
            self.assertEqual(result.returncode, 2, result.stderr[-2000:])
            self.assertEqual(result.stderr.strip().splitlines(), [
                "1 configuration problem:",
                "  - command line: key 'train_batch_size' is 'two'; expected an integer"])
            self.assertFalse((root / "config-out").exists())


if __name__ == "__main__":
    unittest.main()
