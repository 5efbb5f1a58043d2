"""A real stop signal before the first step (here: while latents are cached) stops the run at
once as StopRequested, keeps every latent already cached, leaves no temporary file, and the
rerun encodes only what was not cached yet."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import unittest
from pathlib import Path

from accelerate import Accelerator

from simpletuner.configuration import load_configuration
from simpletuner.training.recipe import Trainer
from simpletuner.training.run.preemption import StopRequested
from training_fixtures import make_shapes, write_config


class CountingTrainer(Trainer):
    """Counts the images its VAE encodes; sends itself a real SIGTERM at encode call
    ``signal_at`` (None: never)."""

    def __init__(self, configuration, accelerator, signal_at: int | None = None):
        super().__init__(configuration, accelerator)
        self.signal_at = signal_at
        self.encoded: list[int] = []

    def _prepare_caches(self):
        encode = self.adapter.encode_images

        def encode_counting(pixels):
            self.encoded.append(len(pixels))
            if len(self.encoded) == self.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return encode(pixels)

        self.adapter.encode_images = encode_counting
        return super()._prepare_caches()


class StopWhileCachingTest(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="st-stop-early-"))
        make_shapes(self.root / "data", per_size=8)  # two sizes: two batches of eight
        self.config = write_config(self.root, self.root / "data", max_train_steps=2)
        self.accelerator = Accelerator(cpu=True)

    def tearDown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def test_the_rerun_encodes_only_what_the_stopped_run_did_not_cache(self):
        stopped = CountingTrainer(load_configuration(self.config), self.accelerator, signal_at=2)
        with self.assertRaises(StopRequested) as caught:
            stopped.run()
        self.assertEqual(caught.exception.signal_name, "SIGTERM")
        self.assertEqual(stopped.encoded, [8, 8])  # the second batch was cut short
        self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)  # handlers restored
        output = stopped.output_dir
        self.assertEqual([p for p in output.rglob("*.tmp")], [])
        self.assertFalse(list(output.glob("checkpoint-*")))

        rerun = CountingTrainer(load_configuration(self.config), self.accelerator)
        rerun.set_up()
        self.assertEqual(rerun.encoded, [8])
        self.assertEqual(rerun.state.step, 0)



if __name__ == "__main__":
    unittest.main()
