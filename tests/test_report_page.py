"""The run report's page from files written by hand: how a failed run reads, what a torn or
damaged file becomes (a note, never a traceback), long curves thinned to a bounded page, axes
whose ticks cover every point, and a run folder of the version before events.jsonl."""

from __future__ import annotations

import html
import json
import tempfile
import unittest
from pathlib import Path

from simpletuner.cli import main as cli_main
from simpletuner.training.checkpointing.manifest import write_manifest
from simpletuner.training.reporting.report_charts import MAX_POINTS, nice_ticks
from simpletuner.training.reporting.report_page import render_report
from simpletuner.training.reporting.run_log import RunLog
from simpletuner.training.run.output_dir_lock import OutputDirLock
from training_fixtures import ReportView


def write_steps(folder: Path, count: int, torn: bool = False) -> None:
    """events.jsonl with a start line and ``count`` step lines, then an eval line at step 2."""
    events = [{"type": "start", "step": 0, "time": 1000.0, "resumed_from": None}]
    events += [{"type": "step", "step": s, "time": 1000.0 + s, "loss": 1.0 / s, "lr": 1e-4,
                "skipped": False, "elapsed": float(s)} for s in range(1, count + 1)]
    events.insert(3, {"type": "eval", "step": 2, "time": 1002.5, "eval_loss": 0.25})
    text = "".join(json.dumps(event) + "\n" for event in events)
    (folder / "events.jsonl").write_text(text + ('{"type": "step", "step": ' if torn else ""))


class ReportPageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def page(self) -> str:
        """The page's text, HTML entities decoded."""
        return html.unescape(render_report(self.out).read_text(encoding="utf-8"))

    def test_a_failed_run_says_failed_with_its_message(self):
        log = RunLog(self.out, main=True, render=render_report)
        log.output_dir_accepted()
        log.start(total_steps=10, settings={"learning_rate": 1e-4},
                  buckets={"photos": {"64x64": 3}}, effective_batch=2, world_size=1)
        log.log_step(1, 0.5, 1e-4, skipped=False)
        log.end_with(RuntimeError("the disk at /data went away"))
        page = (self.out / "training_report.html").read_text()
        self.assertEqual(ReportView(page).status, "failed")
        self.assertIn("RuntimeError: the disk at /data went away", page)
        self.assertEqual(ReportView(page).series["loss"], [(1, 0.5)])

    def test_a_run_on_another_rank_writes_nothing(self):
        log = RunLog(self.out, main=False, render=render_report)
        log.output_dir_accepted()
        log.start(total_steps=10, settings={}, buckets={}, effective_batch=2, world_size=1)
        log.log_step(1, 0.5, 1e-4, skipped=False)
        log.finish()
        self.assertEqual(list(self.out.iterdir()), [])

    def test_nothing_is_written_before_the_preflight_accepted_output_dir(self):
        log = RunLog(self.out, main=True, render=render_report)
        log.end_with(RuntimeError("output_dir is a dataset's folder"))
        self.assertEqual(list(self.out.iterdir()), [])

    def test_the_trace_is_checked_at_the_end_of_the_run_only(self):
        (self.out / "trace").mkdir()
        (self.out / "trace" / "plan.json").write_text(json.dumps({"world_size": 1,
                                                                   "epochs": {}}))
        log = RunLog(self.out, main=True, render=render_report)
        log.output_dir_accepted()
        log.render()
        during = html.unescape((self.out / "training_report.html").read_text())
        self.assertIn("Checked when the run ends", during)
        log.finish()
        after = html.unescape((self.out / "training_report.html").read_text())
        self.assertNotIn("Checked when the run ends", after)
        self.assertIn("trace of rank 0 not found", after)  # the check was made, and says why not

    def test_a_resumed_run_keeps_the_steps_up_to_the_resume_step_only(self):
        write_steps(self.out, 6)
        log = RunLog(self.out, main=True, render=render_report)
        log.output_dir_accepted(resumed_from=4)
        log.start(total_steps=10, settings={}, buckets={}, effective_batch=2, world_size=1)
        view = ReportView(self.page())
        self.assertEqual([s for s, _ in view.series["loss"]], [1, 2, 3, 4])
        self.assertEqual(view.series["eval loss"], [(2, 0.25)])

    def test_a_folder_of_the_version_before_events_jsonl_still_renders(self):
        """training_steps.jsonl and eval_loss.jsonl as that version wrote them."""
        (self.out / "training_status.json").write_text(json.dumps(
            {"status": "finished", "exit_status": 0, "step": 3, "total_steps": 3}))
        (self.out / "training_steps.jsonl").write_text(
            '{"step": 1, "loss": 0.5, "lr": 0.001, "skipped": false, "time": 1001.0}\n'
            '{"step": 2, "loss": null, "lr": 0.001, "skipped": true, "time": 1002.0}\n'
            '{"step": 3, "loss": 0.25, "lr": 0.0005, "skipped": false, "time": 1003.0}\n')
        (self.out / "eval_loss.jsonl").write_text('{"step": 2, "eval_loss": 0.75}\n')
        self.assertEqual(cli_main(["report", str(self.out)]), 0)
        view = ReportView((self.out / "training_report.html").read_text(encoding="utf-8"))
        self.assertEqual(view.status, "finished")
        self.assertEqual(view.series["loss"], [(1, 0.5), (3, 0.25)])
        self.assertEqual(view.series["lr"], [(1, 0.001), (2, 0.001), (3, 0.0005)])
        self.assertEqual(view.nonfinite, [2])
        self.assertEqual(view.series["eval loss"], [(2, 0.75)])

    def test_a_torn_line_and_a_damaged_file_are_notes(self):
        write_steps(self.out, 3, torn=True)
        (self.out / "skipped_files.json").write_text("{not json")
        page = self.page()
        self.assertEqual([s for s, _ in ReportView(page).series["loss"]], [1, 2, 3])
        self.assertIn("events.jsonl: line 6 is not a complete record", page)
        self.assertIn("skipped_files.json: not readable", page)
        self.assertIn("unknown", ReportView(page).status)

    def test_a_long_run_is_thinned_to_a_bounded_page_keeping_the_last_step(self):
        write_steps(self.out, 20_000)
        page = self.page()
        loss = ReportView(page).series["loss"]
        self.assertLessEqual(len(loss), MAX_POINTS + 1)
        self.assertEqual(loss[-1][0], 20_000)
        self.assertLess(len(page), 1_000_000)

    def test_a_checkpoint_changed_after_its_save_fails_the_hash_check_only(self):
        folder = self.out / "checkpoint-3"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights!")
        write_manifest(folder)
        (folder / "model.safetensors").write_bytes(b"weightz!")  # same size, other bytes
        during_run = self.page()
        self.assertIn("every file's size matches manifest.json", during_run)
        command = html.unescape(render_report(self.out, verify_hashes=True).read_text())
        self.assertIn("FAILED", command)
        self.assertIn("SHA-256 mismatch", command)

    def test_the_command_tells_a_killed_run_from_a_running_one_by_the_lock(self):
        (self.out / "training_status.json").write_text(json.dumps({"status": "running"}))
        write_steps(self.out, 7)
        lock = OutputDirLock(self.out)
        self.assertIsNone(lock.try_acquire())
        try:
            self.assertEqual(cli_main(["report", str(self.out)]), 0)
            running = html.unescape((self.out / "training_report.html").read_text())
        finally:
            lock.release()
        self.assertEqual(cli_main(["report", str(self.out)]), 0)
        killed = html.unescape((self.out / "training_report.html").read_text())
        self.assertEqual(ReportView(running).status, "running")
        self.assertEqual(ReportView(killed).status, "killed")
        self.assertIn("was running (step 7), but no process holds output_dir's lock", killed)

    def test_ticks_cover_every_value(self):
        for low, high in ((0.745, 1.12), (3e-5, 3e-4), (-2.0, 7.5), (0.001, 0.001), (1, 8)):
            ticks = nice_ticks(low, high)
            self.assertLessEqual(ticks[0], low)
            self.assertGreaterEqual(ticks[-1], high)
            self.assertLessEqual(len(ticks), 12)
        self.assertEqual(nice_ticks(0, 3, smallest=1), [0, 1, 2, 3])


if __name__ == "__main__":
    unittest.main()
