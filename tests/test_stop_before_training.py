"""A real stop signal before the first step (here: while latents are cached) stops the run at
once as StopRequested, keeps every latent already cached, leaves no temporary file, and the
rerun encodes only what was not cached yet."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
from pathlib import Path

from accelerate import Accelerator

from simpletuner.configuration import load_configuration
from simpletuner.training.recipe import Trainer
from simpletuner.training.run.leftovers import leftovers
from simpletuner.training.run.outcomes import EXIT_PREEMPTED
from simpletuner.training.run.preemption import StopRequested
from launching import Launch
from training_fixtures import environment, make_shapes, write_config


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


class StopDuringDiscoveryTest(unittest.TestCase):
    """A real SIGTERM while discovery waits on a read that never completes (a FIFO named like an
    image: an NFS mount that hangs reads the same way) stops the run at once with 75."""

    def test_a_signal_while_a_header_read_hangs_stops_the_run(self):
        with tempfile.TemporaryDirectory(prefix="st-stop-discovery-") as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=2, sizes=((64, 64),))
            os.mkfifo(root / "data" / "zz-hangs.png")
            config = write_config(root, root / "data", "hangs")
            with Launch([sys.executable, "-m", "simpletuner.train", "--config", config],
                        tmpdir=tmp, env=environment(tmp)) as run:
                deadline = time.monotonic() + 180
                while "reading image headers" not in run.stderr():
                    self.assertIsNone(run.process.poll(), run.stderr()[-3000:])
                    self.assertLess(time.monotonic(), deadline, "discovery did not start")
                    time.sleep(0.1)
                time.sleep(1)  # the read of the FIFO is now blocked
                run.process.send_signal(signal.SIGTERM)
                status = run.wait(60)
            self.assertEqual(status, EXIT_PREEMPTED, run.stderr()[-3000:])
            self.assertIn("[rank 0] training stopped (exit status 75): stopped by SIGTERM before "
                          "the first step", run.stderr())
            self.assertEqual(leftovers(root / "hangs-out"), [])


if __name__ == "__main__":
    unittest.main()
