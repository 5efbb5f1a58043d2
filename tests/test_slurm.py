"""examples/slurm/train.sbatch on a real SLURM (a one-host cluster, slurm_cluster.py): a 2-task
CPU job is sent the warning signal mid-run (what --signal=B:TERM@120 delivers before the time
limit), checkpoints, exits 75 and requeues itself; brought back at once (its BeginTime lowered), it
resumes from 'latest' and ends with the weights, trace and loss of an uninterrupted 2-process
run started beside it, and the audit over its trace finds every sample exactly once. Skipped,
with the reason printed, only where the daemons cannot start (CI installs them, .ci/run)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import unittest
from datetime import datetime, timedelta
from pathlib import Path

from safetensors.torch import load_file

from launching import REPO, Launch
from slurm_cluster import ClusterUnavailable, SlurmCluster
from training_fixtures import environment, make_shapes, read_jsonl, read_report, write_config

TIMEOUT = 240
REQUIRE_SLURM = "SIMPLETUNER_TESTS_REQUIRE_SLURM"
OPTIONS = dict(num_processes=2, max_train_steps=6, trace_samples=True)
SIGNAL_AT_LINE = 2  # micro-batches in rank 0's trace when the signal is sent
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED"}  # scontrol's JobState of a job that is over


def unet(output_dir: Path) -> dict:
    return load_file(str(output_dir / "pipeline" / "unet" / "diffusion_pytorch_model.safetensors"))


def wait_until(condition, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class SlurmRequeueTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="st-slurm-"))
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cluster = SlurmCluster(cls.tmp / "cluster")
        try:
            cls.cluster = cluster.__enter__()
        except ClusterUnavailable as reason:
            if os.environ.get(REQUIRE_SLURM):
                raise AssertionError(str(reason)) from None
            print(f"\ntest_slurm skipped: {reason}", file=sys.stderr)
            raise unittest.SkipTest(str(reason)) from None
        cls.addClassCleanup(cluster.close)
        try:
            cls.run_all()
        except AssertionError as failure:  # a stall: what the job printed says where
            log = getattr(cls, "log", None)
            tail = log.read_text(errors="replace")[-3000:] if log and log.is_file() else ""
            raise AssertionError(f"{failure}\n--- end of the job's log ---\n{tail}") from None

    @classmethod
    def run_all(cls) -> None:
        root, jobs_tmp = cls.tmp, cls.tmp / "job-tmp"
        jobs_tmp.mkdir()
        make_shapes(root / "data", per_size=4)
        env = environment(str(jobs_tmp))
        reference = Launch([REPO / "train.sh", write_config(root, root / "data", "full",
                                                             **OPTIONS)],
                           tmpdir=jobs_tmp, env=env)
        cls.addClassCleanup(reference.close)
        cls.out, cls.full_out = root / "slurm-out", root / "full-out"
        config = write_config(root, root / "data", "slurm", **OPTIONS)
        cls.job = cls.cluster.submit(["--ntasks-per-node=2", f"--output={root}/slurm-%j.out",
                                      "examples/slurm/train.sbatch", str(config)], env, REPO)
        cls.log = root / f"slurm-{cls.job}.out"
        trace = cls.out / "trace" / "rank-0.jsonl"
        wait_until(lambda: trace.is_file() and len(trace.read_text().splitlines())
                   >= SIGNAL_AT_LINE, "the job's first micro-batches")
        cls.signalled = cls.cluster.run(["scancel", "--batch", "--signal=TERM", cls.job])
        cls.requeued = wait_until(cls._requeued, "the job back in the queue")
        # slurmd refuses a start in the second its credential was revoked (the kill): "Job
        # credential revoked", the job FAILED. SubmitTime is the requeue's.
        requeued_at = datetime.fromisoformat(cls.requeued["SubmitTime"])
        time.sleep(max(0.0, (requeued_at - datetime.now()).total_seconds() + 2))
        # StartTime is what scontrol update calls sbatch's --begin (BeginTime in show job).
        cls.hurried = cls.cluster.run(["scontrol", "update", f"jobid={cls.job}",
                                       "starttime=now"])
        cls.final = wait_until(cls._ended, "the requeued job's end")
        cls.reference_status = reference.wait(TIMEOUT)
        cls.reference_stderr = reference.stderr()

    @classmethod
    def _requeued(cls) -> dict | None:
        """The job once back in the queue; AssertionError when it ended instead."""
        job = cls.cluster.job(cls.job)
        if job.get("JobState") in ENDED:
            raise AssertionError(f"the job ended {job['JobState']} (exit {job['ExitCode']}) "
                                 "instead of requeueing itself")
        return job if job.get("Restarts") == "1" and job.get("JobState") == "PENDING" else None

    @classmethod
    def _ended(cls) -> dict | None:
        job = cls.cluster.job(cls.job)
        return job if job.get("JobState") in ENDED else None

    def job_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else "(no log)"

    def test_the_signal_checkpoints_and_the_job_requeues_itself(self):
        self.assertEqual(self.signalled.returncode, 0, self.signalled.stderr)
        log = self.job_log()
        self.assertRegex(log, r"training stopped \(exit status 75\): preempted by SIGTERM "
                              r"at step \d+", log[-3000:])
        self.assertIn(f"requeueing job {self.job}", log)
        # The signal reached ./train.sh alone, which forwarded it once; torchrun got none
        # (it would have killed its workers 30 s later, mid-checkpoint on a big model).
        self.assertEqual(log.count("train.sh: forwarding SIGTERM"), 1, log[-3000:])
        self.assertNotIn("death signal", log)
        # Requeued, SLURM holds the job back about two minutes; the test brought it forward.
        held = (datetime.fromisoformat(self.requeued["EligibleTime"])
                - datetime.fromisoformat(self.requeued["SubmitTime"]))
        self.assertGreaterEqual(held, timedelta(seconds=60), self.requeued)
        self.assertEqual(self.hurried.returncode, 0, self.hurried.stderr)

    def test_the_requeued_job_resumes_and_ends_with_the_uninterrupted_weights(self):
        self.assertEqual(self.reference_status, 0, self.reference_stderr[-3000:])
        self.assertEqual((self.final["JobState"], self.final["ExitCode"]), ("COMPLETED", "0:0"),
                         self.job_log()[-3000:])
        self.assertIn("resumed from", self.job_log())
        full, resumed = unet(self.full_out), unet(self.out)
        self.assertEqual(full.keys(), resumed.keys())
        worst = max((full[k] - resumed[k]).abs().max().item() for k in full)
        self.assertLessEqual(worst, 1e-6)

    def test_every_sample_is_trained_exactly_once_as_in_the_uninterrupted_run(self):
        for rank in range(OPTIONS["num_processes"]):
            full = read_jsonl(self.full_out / "trace" / f"rank-{rank}.jsonl")
            self.assertEqual(len(full), OPTIONS["max_train_steps"])
            self.assertEqual(read_jsonl(self.out / "trace" / f"rank-{rank}.jsonl"), full)
        self.assertEqual(read_report(self.out).status, "finished")
        page = (self.out / "training_report.html").read_text()
        self.assertIn("OK: every kept occurrence assigned exactly once", page)


if __name__ == "__main__":
    unittest.main()
