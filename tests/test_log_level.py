"""log_level (config.json, or SimpleTuner's SIMPLETUNER_LOG_LEVEL environment variable): which
of the trainer's log lines a run prints. Real one-step runs; the loader's check in process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from unittest import mock

from launching import run_bounded
from training_fixtures import environment, make_shapes, write_config

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.configuration.loader import LOG_LEVEL_ENV

LATIN1_CAPTION = "a caf\u00e9 circle".encode("latin-1")


class LogLevelRunTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-log-level-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def train(self, name: str, environment_level: str, data: Path | None = None,
              **options) -> subprocess.CompletedProcess:
        config = write_config(self.root, data or self.root / "data", name, max_train_steps=1,
                              **options)
        env = dict(environment(self.tmp), **{LOG_LEVEL_ENV: environment_level})
        return run_bounded([sys.executable, "-m", "simpletuner.train", "--config", str(config)],
                           tmpdir=self.tmp, timeout=300, env=env)

    def test_log_level_warning_in_config_json_wins_over_the_environment_and_hides_info(self):
        run = self.train("quiet", "DEBUG", log_level="WARNING")
        self.assertEqual(run.returncode, 0, run.stderr[-3000:])
        self.assertTrue((self.root / "quiet-out" / "pipeline").is_dir())
        self.assertNotRegex(run.stderr, r" (DEBUG|INFO) ")
        self.assertNotIn("done: 1 steps", run.stderr)  # the INFO line a default run ends with

    def test_debug_from_the_environment_shows_the_stack_of_an_expected_error(self):
        data = self.root / "latin1"
        make_shapes(data, per_size=2, sizes=((64, 64),))
        (data / "64x64-00.txt").write_bytes(LATIN1_CAPTION)
        run = self.train("debug", "debug", data=data)  # any case, as SimpleTuner reads it
        self.assertEqual(run.returncode, 1, run.stderr[-3000:])
        self.assertIn("DEBUG simpletuner.common.together: caching text embeddings of dataset "
                      "'shapes' failed on this rank\nTraceback", run.stderr)
        self.assertIn("] training stopped (exit status 1): caching text embeddings", run.stderr)
        self.assertNotIn("DEBUG PIL", run.stderr)  # other libraries stay at INFO


class LogLevelConfigTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="st-log-level-config-")
        self.addCleanup(tmp.cleanup)
        self.root = Path(tmp.name)
        (self.root / "data").mkdir()

    def level(self, environment_level: str | None, **options) -> str:
        config = write_config(self.root, self.root / "data", **options)
        env = {k: v for k, v in os.environ.items() if k != LOG_LEVEL_ENV}
        if environment_level is not None:
            env[LOG_LEVEL_ENV] = environment_level
        with mock.patch.dict(os.environ, env, clear=True):
            return load_configuration(config).training.log_level

    def test_config_json_then_the_environment_then_info(self):
        self.assertEqual(self.level("DEBUG", log_level="ERROR"), "ERROR")
        self.assertEqual(self.level("warning"), "WARNING")
        self.assertEqual(self.level(None), "INFO")

    def test_an_unknown_level_is_a_config_error_naming_where_it_came_from(self):
        with self.assertRaises(ConfigError) as caught:
            self.level("VERBOSE")
        self.assertIn(f"environment variable {LOG_LEVEL_ENV} is 'VERBOSE'; use one of DEBUG, "
                      "INFO, WARNING, ERROR", str(caught.exception))
        with self.assertRaises(ConfigError) as caught:
            self.level(None, log_level="verbose")
        self.assertIn("key 'log_level'", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
