"""The run report as a person sees it: a real tiny run through ./train.sh (validation at steps 3,
6 and 8, a checkpoint every 2 steps, evaluation, a skipped file, trace_samples) is stopped by
SIGTERM mid-run (exit 75), once its page (rewritten during the run) shows step 3's validation,
and resumed. Its training_report.html says "preempted" after the stop and continues the same
curves after the resume; headless Chromium (Debian's chromium) renders
the final page, whose DOM holds the curves' points, every validation image and the buckets, and
whose screenshot is not blank. `python -m simpletuner report` writes it again from disk."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import unittest
from pathlib import Path

from PIL import Image, ImageStat

from headless_browser import chromium
from launching import REPO, Launch, run_bounded
from training_fixtures import (ReportView, environment, make_shapes, read_events, read_report,
                               run_train_sh, write_config)

RUN_TIMEOUT = 400
STOP_AFTER_STEPS = 4  # SIGTERM once the event log shows this many steps (of 8) and the page
#                       shows step 3's validation
PROMPTS = ["a red circle on a blue background", "a yellow circle on a green background"]
OPTIONS = dict(max_train_steps=8, checkpointing_steps=2, validation_steps=3,
               validation_prompt=PROMPTS, validation_num_inference_steps=2,
               eval_steps_interval=2, trace_samples=True)


def stop_once_the_page_shows(run: Launch, out: Path, steps: int, image: str) -> str:
    """SIGTERM once the event log has ``steps`` steps and the page (rewritten during the run)
    shows ``image``; returns the page as it was then."""
    deadline = time.monotonic() + RUN_TIMEOUT
    events, page = out / "events.jsonl", out / "training_report.html"
    while time.monotonic() < deadline and run.process.poll() is None:
        if events.is_file() and events.read_text().count('"type": "step"') >= steps:
            shown = page.read_text() if page.is_file() else ""
            if image in shown:
                os.kill(run.pid, signal.SIGTERM)  # train.sh forwards it to the training process
                return shown
        time.sleep(0.05)
    raise AssertionError(f"the run ended or stalled before step {steps} with {image} shown")


class PreemptedThenResumedRunReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-report-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        (root / "data" / "broken.png").write_bytes(b"not an image at all")
        make_shapes(root / "eval", per_size=1)
        datasets = [{"id": "shapes", "instance_data_dir": str(root / "data"),
                     "caption_strategy": "textfile"},
                    {"id": "held-out", "dataset_type": "eval",
                     "instance_data_dir": str(root / "eval"), "caption_strategy": "textfile"}]
        config = write_config(root, root / "data", "report", datasets=datasets, **OPTIONS)
        cls.out = root / "report-out"
        with Launch([REPO / "train.sh", config], tmpdir=cls.tmp,
                    env=environment(cls.tmp)) as stopped:
            cls.running_report = ReportView(stop_once_the_page_shows(
                stopped, cls.out, STOP_AFTER_STEPS, "validation/step-3/image-01.png"))
            cls.stopped_status = stopped.wait(RUN_TIMEOUT)
        cls.stopped_stderr = stopped.stderr()
        cls.stopped_html = (cls.out / "training_report.html").read_text()
        cls.stopped_report = ReportView(cls.stopped_html)
        resumed = write_config(root, root / "data", "report", datasets=datasets,
                               resume_from_checkpoint="latest", **OPTIONS)
        cls.resumed = run_train_sh(resumed, cls.tmp, timeout=RUN_TIMEOUT)
        cls.final_report = ReportView((cls.out / "training_report.html").read_text())

    @property
    def dom(self) -> ReportView:
        """The final page as headless Chromium's DOM, rendered once for the class."""
        cls = type(self)
        if not hasattr(cls, "rendered"):
            cls.rendered = ReportView(chromium(cls.tmp, "--dump-dom",
                                               (cls.out / "training_report.html").as_uri()))
        return cls.rendered

    def test_the_page_is_current_during_the_run(self):
        self.assertEqual(self.running_report.status, "running")
        self.assertIn("validation/step-3/image-00.png", self.running_report.images)
        self.assertGreaterEqual(len(self.running_report.series["loss"]), 3)

    def test_the_stopped_run_is_reported_as_preempted(self):
        self.assertEqual(self.stopped_status, 75, self.stopped_stderr[-3000:])
        self.assertEqual(self.stopped_report.status, "preempted")
        self.assertIn("exit status 75", self.stopped_html)
        self.assertIn("preempted by SIGTERM at step", self.stopped_html)

    def test_the_resumed_run_continues_the_same_curves(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        stopped_at = max(step for step, _ in self.stopped_report.series["loss"])
        final = self.final_report.series["loss"]
        self.assertEqual([step for step, _ in final], list(range(1, 9)))
        self.assertEqual(final[:stopped_at], self.stopped_report.series["loss"])
        self.assertGreaterEqual(stopped_at, STOP_AFTER_STEPS)

    def test_the_event_log_holds_the_preemption_and_the_resume(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        stopped_at = max(step for step, _ in self.stopped_report.series["loss"])
        self.assertEqual([(e["step"], e["status"]) for e in read_events(self.out, "status")],
                         [(0, "running"), (stopped_at, "preempted"), (stopped_at, "running")])
        self.assertEqual([(e["step"], e["status"], e["exit_status"])
                          for e in read_events(self.out, "end")],
                         [(stopped_at, "preempted", 75), (8, "finished", 0)])
        self.assertEqual([e["resumed_from"] for e in read_events(self.out, "start")],
                         [None, stopped_at])

    def test_the_browser_shows_every_step_and_evaluation_as_a_point(self):
        steps = read_events(self.out, "step")
        self.assertEqual([(r["step"], r["loss"]) for r in steps], self.dom.series["loss"])
        self.assertEqual([(r["step"], r["lr"]) for r in steps], self.dom.series["lr"])
        evals = read_events(self.out, "eval")
        self.assertEqual([(r["step"], r["eval_loss"]) for r in evals],
                         self.dom.series["eval loss"])
        self.assertEqual([step for step, _ in self.dom.series["eval loss"]], [2, 4, 6, 8])
        self.assertEqual(self.dom.status, "finished")

    def test_the_browser_shows_every_validation_image(self):
        on_disk = sorted(p.relative_to(self.out).as_posix()
                         for p in self.out.glob("validation/step-*/image-*.png"))
        self.assertEqual(sorted(self.dom.images), on_disk)
        steps = sorted({int(Path(p).parent.name.split("-")[1]) for p in on_disk})
        self.assertEqual(steps[-2:], [6, 8])
        self.assertIn(3, steps)
        self.assertEqual(len(on_disk), len(steps) * len(PROMPTS))
        html = (self.out / "training_report.html").read_text()
        for prompt in PROMPTS:
            self.assertIn(prompt, html)

    def test_the_page_shows_buckets_skips_exactly_once_and_checkpoints(self):
        self.assertIn(("64x64", 4), self.dom.buckets)
        self.assertIn(("96x64", 4), self.dom.buckets)
        html = (self.out / "training_report.html").read_text()
        self.assertIn("broken.png", html)
        self.assertIn("OK: every kept occurrence assigned exactly once", html)
        for step in (2, 4, 6, 8):
            self.assertIn(f"checkpoint-{step}</td>", html)

    def test_nothing_on_the_page_leaves_the_machine(self):
        html = (self.out / "training_report.html").read_text()
        self.assertNotIn("<script", html)
        self.assertNotIn("://", html)
        self.assertNotIn("url(", html)
        for link in self.dom.links:
            self.assertTrue((self.out / link).is_file(), link)

    def test_the_screenshot_is_not_blank(self):
        png = Path(self.tmp) / "report.png"
        chromium(self.tmp, f"--screenshot={png}", "--window-size=1100,1800",
                 "--hide-scrollbars", (self.out / "training_report.html").as_uri())
        with Image.open(png) as image:
            stats = ImageStat.Stat(image.convert("L"))
            colours = len(image.convert("RGB").getcolors(1 << 20) or [])
        self.assertGreater(stats.stddev[0], 10)
        self.assertGreater(colours, 50)

    def test_the_report_command_writes_the_page_again_from_disk(self):
        page = self.out / "training_report.html"
        before = ReportView(page.read_text())
        page.unlink()
        result = run_bounded([sys.executable, "-m", "simpletuner", "report", self.out],
                             tmpdir=self.tmp, env=environment(self.tmp), timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        again = read_report(self.out)
        self.assertEqual(again.series, before.series)
        self.assertEqual(sorted(again.images), sorted(before.images))
        self.assertIn("size and SHA-256 match", page.read_text())

    def test_the_report_command_refuses_a_folder_without_a_run(self):
        result = run_bounded([sys.executable, "-m", "simpletuner", "report", self.tmp + "/data"],
                             tmpdir=self.tmp, env=environment(self.tmp), timeout=120)
        self.assertEqual(result.returncode, 2)
        self.assertIn("is it a run's output_dir?", result.stderr)


if __name__ == "__main__":
    unittest.main()
