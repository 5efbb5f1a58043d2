"""Fail together: a failure that one rank sees, at any step, stops every rank with the same
message and a non-zero status; no rank is left waiting in a collective (a hang fails the test).

Each case is one 2-process gloo run (torchrun + tests/fault_launcher.py) of the tiniest config:
4 images in one bucket, batch 2, one step. Real faults where a file can aim at one rank or at
the main rank's work; a patched function where it cannot."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from fault_launcher import injected_message
from launching import run_bounded
from training_fixtures import environment, make_shapes, run_training, write_config

from simpletuner.common.error_report import unexpected_ranks
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.caching.prepare import read_captions
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.backends.captions import CaptionError
from simpletuner.common.together import (RankFailure, class_names, describe_error,
                                         describe_failures)
from simpletuner.training.preflight import merge_rank_problems

LAUNCHER = Path(__file__).resolve().parent / "fault_launcher.py"
RUN_TIMEOUT = 150  # one run takes ~10 s; past this the ranks are taken to hang
LATIN1_CAPTION = "a caf\u00e9 circle".encode("latin-1")
# Sorted sample ids 64x64-00..03: caching gives rank 0 the even ones, rank 1 the odd ones.
CAPTION_OF_RANK = {0: "64x64-00.txt", 1: "64x64-01.txt"}


class FailTogetherTest(unittest.TestCase):
    """Each run: a fresh folder, the fault, both ranks, every rank's status and message."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-together-")
        cls.env = environment(cls.tmp)  # one model cache for every run
        cls.env.update(ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def new_run(self) -> None:
        """A fresh dataset and output folder for the next run."""
        self.root = Path(tempfile.mkdtemp(dir=self.tmp))
        make_shapes(self.root / "data", per_size=4, sizes=((64, 64),))
        self.output = self.root / "run-out"
        self.status_dir = self.root / "status"
        self.status_dir.mkdir()

    def config(self, **options) -> Path:
        return write_config(self.root, self.root / "data", "run", max_train_steps=1, **options)

    def launch(self, entry: str, entry_args: list[str], fault: str | None = None,
               on_rank: int = 0, config_problem: bool = False, broken_self: bool = False,
               signalled_after: int | None = None) -> subprocess.CompletedProcess:
        injection = ["--fault", fault, "--on-rank", str(on_rank)] if fault else []
        if config_problem:
            injection.append("--config-problem")
        if broken_self:
            injection.append("--broken-self")
        if signalled_after:
            injection += ["--signalled-after", str(signalled_after)]
        # Each rank's stderr goes to its own file (--redirects 2), so lines never interleave.
        return run_bounded([
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
            "2", "--monitor-interval", "1", "--log-dir", str(self.root / "logs"),
            "--redirects", "2", str(LAUNCHER), str(self.status_dir), *injection,
            entry, *entry_args], tmpdir=self.tmp, env=self.env, timeout=RUN_TIMEOUT)

    def train(self, config_options: dict | None = None,
              **launch_options) -> subprocess.CompletedProcess:
        return self.launch("train", ["--config", str(self.config(**(config_options or {})))],
                           **launch_options)

    def rank_stderr(self, rank: int) -> str:
        (log,) = self.root.glob(f"logs/*/attempt_0/{rank}/stderr.log")
        return log.read_text()

    def assertStoppedTogether(self, run, fragment: str, status: int = 1, verb: str = "training"):
        """Both ranks exit with ``status`` and print the same message holding ``fragment``."""
        logs = [self.rank_stderr(rank) for rank in (0, 1)]
        context = "\n".join(log[-3000:] for log in logs) + run.stderr[-2000:]
        statuses = [self.status_dir / f"rank-{rank}.status" for rank in (0, 1)]
        self.assertEqual([f.read_text() if f.exists() else "killed" for f in statuses],
                         [str(status)] * 2, context)
        # The message: its line, and the indented lines of a ConfigError's list after it.
        pattern = r"^\[rank {}\] {} stopped(?: \(exit status \d+\))?: (.*(?:\n[ \t].*)*)"
        messages = [re.findall(pattern.format(rank, verb), log, re.M)
                    for rank, log in enumerate(logs)]
        self.assertEqual(len(messages[0]), 1, context)
        self.assertEqual(messages[0], messages[1])
        self.assertIn(fragment, messages[0][0])
        self.assertNotEqual(run.returncode, 0)

    # -- start-up checks: the main rank first, then the others ----------------------------

    def test_a_config_problem_only_a_non_main_rank_sees_stops_both_as_a_config_error(self):
        self.new_run()
        run = self.train(fault="simpletuner.training.preflight:run_preflight", on_rank=1,
                         config_problem=True)
        self.assertStoppedTogether(run, f"on rank 1: {injected_message(1)}", status=2)

    def test_an_error_in_the_main_ranks_checks_stops_both(self):
        self.new_run()
        run = self.train(fault="simpletuner.training.preflight:run_preflight", on_rank=0)
        self.assertStoppedTogether(
            run, f"start-up checks on the main process failed on rank 0: RuntimeError: "
                 f"{injected_message(0)}")

    # -- the model: every rank loads its own copy -----------------------------------------

    def test_a_model_that_one_rank_cannot_load_stops_both(self):
        self.new_run()
        run = self.train(fault="simpletuner.models.base:ModelAdapter.move_to", on_rank=1)
        self.assertStoppedTogether(
            run, f"loading the model failed on rank 1: RuntimeError: {injected_message(1)}")

    def test_a_bug_on_one_rank_keeps_that_ranks_traceback_in_the_file_both_name(self):
        self.new_run()
        run = self.train(fault="simpletuner.models.base:ModelAdapter.move_to", on_rank=1,
                         broken_self=True)
        kept = self.output / "logs" / "rank-1-error.txt"
        self.assertStoppedTogether(
            run, "loading the model failed on rank 1: AttributeError: 'NoneType' object has no "
                 f"attribute 'trainable'; traceback in {kept}")
        stack = kept.read_text()
        # The original stack, down to the line that raised, then the agreed failure it caused.
        self.assertRegex(stack, r'File "[^"]*simpletuner/models/base\.py", line \d+, in move_to'
                                r'\n +to_device_except\(self\.trainable, ')
        self.assertIn(", in run_training\n", stack)
        self.assertIn("The above exception was the direct cause", stack)
        self.assertTrue(stack.endswith("RankFailure: loading the model failed on rank 1: "
                                       "AttributeError: 'NoneType' object has no attribute "
                                       "'trainable'\n"), stack[-500:])
        self.assertRegex(self.rank_stderr(1), r"ERROR simpletuner\.common\.error_report: "
                                              r"\[rank 1\] unexpected error\nTraceback")
        self.assertNotIn("Traceback", self.rank_stderr(0))  # rank 0 only waited
        self.assertFalse((self.output / "logs" / "rank-0-error.txt").exists())

    # -- caching: each rank encodes and reads captions for its own share ------------------

    def test_an_encode_error_on_either_rank_stops_both(self):
        for rank in (1, 0):
            with self.subTest(rank=rank):
                self.new_run()
                run = self.train(fault="simpletuner.models.unet_family:"
                                       "UNetFamilyAdapter.encode_images", on_rank=rank)
                self.assertStoppedTogether(
                    run, f"caching latents of dataset 'shapes' failed on rank {rank}: "
                         f"RuntimeError: {injected_message(rank)}")

    def test_a_non_utf8_caption_in_either_ranks_share_stops_both_naming_the_file(self):
        for rank, caption in CAPTION_OF_RANK.items():
            with self.subTest(rank=rank):
                self.new_run()
                (self.root / "data" / caption).write_bytes(LATIN1_CAPTION)
                run = self.train()
                self.assertStoppedTogether(
                    run, f"caching text embeddings of dataset 'shapes' failed on rank {rank}: "
                         f"CaptionError: 1 caption file(s) cannot be used: caption file "
                         f"{self.root / 'data' / caption} is not UTF-8 text")

    # -- main-rank-only work before a barrier: real faults in the main rank's output ------

    def test_a_validation_error_on_the_main_rank_stops_both(self):
        self.new_run()
        self.output.mkdir()
        (self.output / "validation").write_text("a file where a folder must go")
        run = self.launch("train", ["--config", str(self.config(
            validation_prompt="a red circle", validation_num_inference_steps=1))])
        self.assertStoppedTogether(run, "validation at step 1 failed on rank 0: "
                                        "NotADirectoryError")

    def test_a_skipped_files_report_write_error_on_the_main_rank_stops_both(self):
        self.new_run()
        report = self.output / "skipped_files.json"
        report.mkdir(parents=True)
        run = self.train()
        self.assertStoppedTogether(run, f"writing {report} failed on rank 0: IsADirectoryError")

    def test_an_export_error_on_the_main_rank_stops_both(self):
        self.new_run()
        (self.output / "training_summary.json").mkdir(parents=True)
        run = self.train()
        self.assertStoppedTogether(run, "the export failed on rank 0: IsADirectoryError")

    # -- a stop signal that reaches one rank before the first step -----------------------

    def test_a_signal_to_one_rank_while_caching_stops_both_as_a_stop(self):
        self.new_run()
        run = self.train(fault="simpletuner.models.unet_family:UNetFamilyAdapter.encode_images",
                         on_rank=1, signalled_after=1)
        statuses = [(self.status_dir / f"rank-{rank}.status").read_text() for rank in (0, 1)]
        context = self.rank_stderr(0)[-3000:] + self.rank_stderr(1)[-3000:]
        self.assertEqual(statuses, ["75", "75"], context)
        self.assertRegex(self.rank_stderr(1), r"\[rank 1\] training stopped \(exit status 75\): "
                                              r"stopped by SIGTERM before the first step")
        self.assertRegex(self.rank_stderr(0), r"\[rank 0\] training stopped \(exit status 75\): "
                                              r"stopped before the first step with its peers "
                                              r"\(rank 1 by SIGTERM\)")
        self.assertNotIn("Traceback", self.rank_stderr(0))
        self.assertFalse((self.output / "logs" / "rank-0-error.txt").exists())

    def test_an_audit_plan_write_error_on_the_main_rank_stops_both(self):
        self.new_run()
        audit_dir = self.root / "audit"
        (audit_dir / "plan.json").mkdir(parents=True)
        run = self.launch("audit", ["--config", str(self.config()), "--output", str(audit_dir)])
        self.assertStoppedTogether(run, f"writing {audit_dir / 'plan.json'} failed on rank 0: "
                                        "IsADirectoryError", verb="audit")


class CaptionReadTest(unittest.TestCase):
    """One process: captions that are not UTF-8 are one clear error naming every such file."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="st-caption-")
        self.addCleanup(tmp.cleanup)
        self.root = Path(tmp.name)
        self.ids = make_shapes(self.root / "data", per_size=4, sizes=((64, 64),))
        self.bad = [self.root / "data" / caption for caption in CAPTION_OF_RANK.values()]
        for caption in self.bad:
            caption.write_bytes(LATIN1_CAPTION)
        self.config = write_config(self.root, self.root / "data", max_train_steps=1)

    def test_every_unreadable_caption_is_named_with_the_fix(self):
        configuration = load_configuration(self.config)
        backend = MetadataBackend.from_config(configuration.datasets[0], configuration.training)
        with self.assertRaises(CaptionError) as caught:
            read_captions(backend.caption_for, self.ids)
        message = str(caught.exception)
        self.assertTrue(message.startswith("2 caption file(s) cannot be used"), message)
        for caption in self.bad:
            self.assertIn(f"caption file {caption} is not UTF-8 text (byte 0xe9 at position 5); "
                          "re-save it as UTF-8", message)
        readable = self.ids[2:]
        self.assertEqual(read_captions(backend.caption_for, readable),
                         [(self.root / "data" / s).with_suffix(".txt").read_text()
                          for s in readable])

    def test_training_stops_with_one_line_and_no_traceback(self):
        run = run_training(self.config, str(self.root))
        self.assertEqual(run.returncode, 1, run.stderr[-3000:])
        self.assertNotIn("Traceback", run.stderr)
        (message,) = re.findall(r"^\[rank 0\] training stopped \(exit status 1\): (.*)$",
                                run.stderr, re.M)
        self.assertIn("CaptionError: 2 caption file(s) cannot be used: caption file "
                      f"{self.bad[0]} is not UTF-8 text", message)
        self.assertNotIn("traceback in", message)  # an expected error: its message is the story
        self.assertFalse((self.root / "config-out" / "logs" / "rank-0-error.txt").exists())


class MessageTest(unittest.TestCase):
    """The one message every rank prints names each error once, with the ranks that saw it."""

    def test_the_same_error_on_several_ranks_is_named_once(self):
        self.assertEqual(describe_failures("export", [(0, "E: x"), (2, "E: x")]),
                         "export failed on ranks 0, 2: E: x")
        self.assertEqual(str(RankFailure("export", [(1, "E: x"), (2, "F: y")])),
                         "export failed on 2 ranks: rank 1: E: x; rank 2: F: y")

    def test_only_the_ranks_whose_error_is_unexpected_have_a_traceback_file(self):
        errors = {0: ConfigError(["a"]), 1: AttributeError("b"), 2: KeyError("c")}
        failure = RankFailure("x", [(r, describe_error(e)) for r, e in errors.items()],
                              {r: class_names(e) for r, e in errors.items()})
        self.assertEqual(unexpected_ranks(failure, 0, (ConfigError,)), [1, 2])
        self.assertEqual(unexpected_ranks(failure, 0, (ConfigError, LookupError)), [1])
        self.assertEqual(unexpected_ranks(errors[1], 3, (ConfigError,)), [3])
        self.assertEqual(unexpected_ranks(errors[0], 3, (ConfigError,)), [])

    def test_a_problem_every_rank_saw_is_listed_without_ranks(self):
        self.assertEqual(merge_rank_problems([["a", "b"], ["a"], ["a", "b", "c"]]),
                         ["a", "on ranks 0, 2: b", "on rank 2: c"])


if __name__ == "__main__":
    unittest.main()
