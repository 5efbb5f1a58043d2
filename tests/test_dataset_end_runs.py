"""end_step and end_epoch in real runs. The audit on 3 gloo processes through the real start-up
and sampler: lockstep, every occurrence of the datasets still drawn once, nothing of an ended
dataset after its end. And ./train.sh (tiny sd1x LoRA) with SimpleTuner's curriculum (one
dataset to step 3, one from step 3), resumed from the checkpoint of step 2, before the end: the
resumed run's samples and losses are the uninterrupted run's."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from collections import Counter
from pathlib import Path

from test_distributed_schedule import audit_in_processes, lockstep_traces
from test_schedule_training import run_then_resume, step_losses
from training_fixtures import make_shapes, read_jsonl

END_STEP = 2
DATASETS = {"photos": (36, {"probability": 0.3}), "early": (18, {"end_step": END_STEP}),
            "first": (12, {"end_epoch": 1})}


class EndAuditTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        audit_in_processes(cls, DATASETS, [(64, 64)], seed=3, epochs=2)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_the_audit_passes_and_nothing_trains_after_an_end(self):
        for rank, (code, out, err) in enumerate(self.results):
            self.assertEqual(code, 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}")
        self.assertIn("OK: every kept occurrence assigned exactly once", self.results[0][1])
        traces = lockstep_traces(self)
        per_epoch = Counter(r["epoch"] for r in traces[0])
        early = [r for r in traces[0] if r["dataset"] == "early"]
        self.assertTrue(early)
        self.assertTrue(all(r["epoch"] == 0 and r["step"] < END_STEP for r in early), early)
        self.assertEqual({r["epoch"] for r in traces[0] if r["dataset"] == "first"}, {0})
        # E = 2 x 3 = 6: in epoch 1 only photos are left, 36 / 6 = 6 steps
        self.assertEqual(per_epoch[1], 6)
        trained = sum(len(r["samples"]) for t in traces for r in t if r["dataset"] == "early")
        self.assertLessEqual(trained, 12)  # 2 of its 3 steps of 6 at most: the end cut it
        self.assertIn(f"{18 - trained} left untrained where a dataset ended", self.results[0][1])


class CurriculumResumeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-end-")
        root = Path(cls.tmp)
        make_shapes(root / "low", per_size=8, sizes=((64, 64),))
        make_shapes(root / "high", per_size=8, sizes=((96, 64),))
        datasets = [{"id": "low", "instance_data_dir": str(root / "low"), "end_step": 3},
                    {"id": "high", "instance_data_dir": str(root / "high"), "start_step": 3}]
        options = dict(datasets=datasets, model_type="lora", lora_rank=4, max_train_steps=6,
                       checkpointing_steps=2, trace_samples=True, report_to="tensorboard")
        run_then_resume(cls, root / "low", options, 2)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_low_until_step_3_then_high_and_resume_is_exact(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-3000:])
        trace = read_jsonl(self.full_out / "trace" / "rank-0.jsonl")
        by_step = [(r["epoch"], r["dataset"]) for r in trace]
        self.assertEqual(len(by_step), 6)
        self.assertTrue(all(d == "low" for _, d in by_step[:2]), by_step)  # high from step 3
        self.assertTrue(all(d == "high" for _, d in by_step[3:]), by_step)  # low to step 3
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertEqual(read_jsonl(self.resumed_out / "trace" / "rank-0.jsonl"), trace[2:])
        full, resumed = step_losses(self.full_out), step_losses(self.resumed_out)
        self.assertEqual(sorted(resumed), list(range(3, 7)))
        for step, loss in resumed.items():
            self.assertAlmostEqual(loss, full[step], places=5)
        self.assertNotIn("Resuming with different data settings", self.resumed.stderr)


if __name__ == "__main__":
    unittest.main()
