"""Context parallel trains what data parallel trains: tiny Flux for a few steps on 4 real gloo
processes with context_parallel_size 2 (2 data-parallel groups, each rank holding half of the
token sequence, Ulysses all-to-all attention) ends with the weights of the same run on 2
processes without it (the same global batch), within float tolerance; the traces show each
group's two ranks training the same samples; its validation runs on the main rank alone."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
import unittest
from pathlib import Path

from safetensors.torch import load_file

from launching import REPO, Launch
from test_distributed import free_port
from training_fixtures import environment, make_shapes, read_events, read_jsonl, write_config

TIMEOUT_S = 400
WEIGHTS = "pipeline/transformer/diffusion_pytorch_model.safetensors"


def launch_training(config: Path, world: int, tmpdir: str) -> list[tuple[int, str]]:
    """Each rank as torchrun starts it; (exit status, stderr) per rank."""
    port = str(free_port())
    with contextlib.ExitStack() as runs:  # leaving it kills every rank still running
        launches = []
        for rank in range(world):
            env = {**environment(tmpdir), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                   "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
                   "ACCELERATE_USE_CPU": "true", "PYTHONPATH": str(REPO)}
            launches.append(runs.enter_context(Launch(
                [sys.executable, "-m", "simpletuner.train", "--config", str(config)],
                tmpdir=tmpdir, env=env)))
        deadline = time.monotonic() + TIMEOUT_S
        statuses = [run.wait(max(1.0, deadline - time.monotonic())) for run in launches]
    return [(status, run.stderr()) for status, run in zip(statuses, launches)]


class ContextParallelTrainingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        root = cls.root = Path(cls._tmp.name)
        make_shapes(root / "data", per_size=4, sizes=((64, 64),))
        options = dict(model_family="flux", pretrained_model_name_or_path="builtin:tiny-flux",
                       train_batch_size=1, max_train_steps=2, trace_samples=True,
                       learning_rate=1e-3, adam_epsilon=1e-3)
        cls.results = {}
        # The context-parallel run validates at its end too: the main rank alone, hooks off.
        validation = dict(validation_prompt="a red circle", validation_num_inference_steps=1)
        for name, world, c, more in (("cp", 4, 2, validation), ("dp", 2, 1, {})):
            config = write_config(root, root / "data", name, num_processes=world,
                                  context_parallel_size=c, **options, **more)
            cls.results[name] = launch_training(config, world, str(root))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_two_groups_of_two_learn_what_two_processes_learn(self):
        for name, results in self.results.items():
            for rank, (status, err) in enumerate(results):
                self.assertEqual(status, 0, f"{name} rank {rank}:\n{err[-4000:]}")
        cp = load_file(self.root / "cp-out" / WEIGHTS)
        dp = load_file(self.root / "dp-out" / WEIGHTS)
        from simpletuner.models.builtin import ensure_builtin_model

        start = load_file(ensure_builtin_model("tiny-flux") / "transformer"
                          / "diffusion_pytorch_model.safetensors")
        self.assertEqual(set(cp), set(dp))
        moved = max((dp[k].float() - start[k].float()).abs().max().item() for k in dp)
        self.assertGreater(moved, 1e-4, "the runs trained nothing")
        for key in dp:
            difference = (cp[key].float() - dp[key].float()).abs().max().item()
            self.assertLess(difference, 2e-5, f"{key}: C=2 differs from C=1 by {difference}")

    def test_each_group_trains_one_micro_batch_on_both_its_ranks(self):
        traces = [read_jsonl(self.root / "cp-out" / "trace" / f"rank-{r}.jsonl")
                  for r in range(4)]
        alike = [[r["samples"] for r in trace] for trace in traces]
        self.assertEqual(alike[0], alike[1])
        self.assertEqual(alike[2], alike[3])
        self.assertNotEqual(alike[0], alike[2])
        dp = [[r["samples"] for r in read_jsonl(self.root / "dp-out" / "trace" / f"rank-{r}.jsonl")]
              for r in range(2)]
        self.assertEqual([alike[0], alike[2]], dp)
        plan = json.loads((self.root / "cp-out" / "trace" / "plan.json").read_text())
        self.assertEqual((plan["world_size"], plan["context_parallel"]), (2, 2))

    def test_the_main_rank_validates_alone(self):
        (event,) = read_events(self.root / "cp-out", "validation")
        self.assertEqual(event["step"], 2)
        for name in event["files"]:
            self.assertTrue((self.root / "cp-out" / name).is_file(), name)


if __name__ == "__main__":
    unittest.main()
