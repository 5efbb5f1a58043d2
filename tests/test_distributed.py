"""Real processes (gloo on CPU, 4 ranks, and issue 22's case on 8): the audit through the real
MetadataBackend and sampler, with bucket_tail carry (the default) and an evaluation set smaller
than the number of ranks.

Ranks are started the way torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), one
process each (tests/launching.py: bounded, a private TMPDIR), so every rank's exit status and
output can be checked on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sys
import tempfile
import time
import unittest
from collections import Counter
from pathlib import Path

from PIL import Image

from launching import REPO, Launch, run_bounded

WORLD = 4
TIMEOUT_S = 120
# dataset id -> (images, sizes cycled, repeats, per-dataset batch)
DATASETS = {"photos": (61, [(64, 64), (64, 96), (96, 64)], 0, 2),
            "art": (11, [(64, 64), (48, 96)], 2, 1)}
EVAL_IMAGES = 3  # on 4 ranks: one step each, the last rank's a stand-in


def make_datasets(root: Path) -> dict[str, list[str]]:
    """Tiny PNGs in nested folders; returns the sample ids of each dataset."""
    made = {}
    for dataset_id, (count, sizes, repeats, batch) in DATASETS.items():
        made[dataset_id] = []
        for i in range(count):
            sample_id = f"part{i % 2}/{dataset_id}_{i:03d}.png"
            path = root / dataset_id / sample_id
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", sizes[i % len(sizes)], (i * 40 % 256, 90, 160)).save(path)
            made[dataset_id].append(sample_id)
    backends = [{"id": d, "instance_data_dir": str(root / d), "caption_strategy": "filename",
                 "repeats": repeats, "train_batch_size": batch}
                for d, (_, _, repeats, batch) in DATASETS.items()]
    (root / "held").mkdir()
    for i in range(EVAL_IMAGES):
        Image.new("RGB", (64, 64), (i * 60, 30, 90)).save(root / "held" / f"held_{i}.png")
    backends.append({"id": "held", "dataset_type": "eval", "instance_data_dir": str(root / "held"),
                     "caption_strategy": "filename"})
    (root / "multidatabackend.json").write_text(json.dumps(backends))
    return made


def write_config(root: Path, name: str, **options) -> Path:
    config = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
              "output_dir": str(root / "out"),
              "data_backend_config": str(root / "multidatabackend.json"),
              "resolution": 64, "aspect_bucket_alignment": 16, "train_batch_size": 2,
              "gradient_accumulation_steps": 2, **options}
    path = root / name
    path.write_text(json.dumps(config))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], world: int, tmpdir: str,
           per_rank: dict[int, list[str]] | None = None) -> list[tuple[int, str, str]]:
    """(exit status, stdout, stderr) per rank; past the limit every rank is killed and the test
    fails (a hang).

    ``per_rank`` replaces the arguments of some ranks (to make one rank see other data).
    """
    port = str(free_port())
    with contextlib.ExitStack() as runs:  # leaving it kills every rank still running
        launches = []
        for rank in range(world):
            rank_args = (per_rank or {}).get(rank, args)
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                   "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                   "LOCAL_WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
                   "ACCELERATE_USE_CPU": "true", "PYTHONPATH": str(REPO)}
            launches.append(runs.enter_context(Launch(
                [sys.executable, "-m", "simpletuner.audit", *rank_args], tmpdir=tmpdir, env=env)))
        deadline = time.monotonic() + TIMEOUT_S
        statuses = [run.wait(max(1.0, deadline - time.monotonic())) for run in launches]
    return [(status, run.stdout(), run.stderr()) for status, run in zip(statuses, launches)]


class DistributedAuditTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.root = Path(cls._tmp.name)
        cls.private_tmp = cls.root / "tmp"
        cls.private_tmp.mkdir()
        cls.samples = make_datasets(cls.root)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_no_seed_run_assigns_every_occurrence_of_every_pass_once_with_one_seed(self):
        config = write_config(self.root, "noseed.json")
        output = self.root / "audit-noseed"
        epochs = 2
        results = launch(["--config", str(config), "--output", str(output),
                          "--epochs", str(epochs)], WORLD, str(self.private_tmp))
        for rank, (code, out, err) in enumerate(results):
            self.assertEqual(code, 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}")
        seeds = set()
        for rank, (_, _, err) in enumerate(results):
            found = re.findall(rf"\[rank {rank}\] seed (\d+),", err)
            self.assertEqual(len(found), 1, err[-2000:])
            seeds.add(int(found[0]))
        self.assertEqual(len(seeds), 1, f"ranks disagree on the seed: {seeds}")
        plan = json.loads((output / "plan.json").read_text())
        self.assertEqual(plan["seed"], seeds.pop())
        self.assertEqual(plan["world_size"], WORLD)
        self.assertIn("epoch 1: ", results[0][1])
        self.assertIn(" 0 missing, 0 duplicated", results[0][1])
        self.assertIn("only the last epoch's", results[0][1])  # carried: nothing was trimmed

        traces = [[json.loads(line) for line in
                   (output / f"rank-{r}.jsonl").read_text(encoding="utf-8").splitlines()]
                  for r in range(WORLD)]
        self.assertEqual(len({len(t) for t in traces}), 1, "unequal micro-batch counts")
        for epoch in range(epochs):
            per_rank = [[m for m in t if m["epoch"] == epoch] for t in traces]
            self.assertGreater(len(per_rank[0]), 0)
            for step, batches in enumerate(zip(*per_rank)):
                self.assertEqual({m["step"] for m in batches}, {step})
                self.assertEqual(len({(m["dataset"], m["bucket"]) for m in batches}), 1,
                                 f"epoch {epoch} step {step}: ranks in different buckets")
            for m in per_rank[0]:
                self.assertEqual(len(m["samples"]), DATASETS[m["dataset"]][3])
            # bucket_tail carry: the epoch trains what the previous one carried, then its own
            # pass (every file repeats+1 times) less what it carries on.
            got = Counter((m["dataset"], s) for t in per_rank for m in t for s in m["samples"])
            one_pass = Counter({(d, s): DATASETS[d][2] + 1
                                for d, ids in self.samples.items() for s in ids})
            self.assertEqual(got + self.carried(plan, epoch),
                             one_pass + self.carried(plan, epoch - 1), f"epoch {epoch}")
            self.assertEqual([ids for buckets in plan["epochs"][str(epoch)].values()
                              for ids in buckets.values() if ids], [], "carry trims nothing")
        self.check_evaluation(output / "eval", results[0][1])

    @staticmethod
    def carried(plan: dict, epoch: int) -> Counter:
        return Counter((d, s) for d, buckets in plan["carried"].get(str(epoch), {}).items()
                       for ids in buckets.values() for s in ids)

    def check_evaluation(self, folder: Path, stdout: str):
        """Each evaluation image once over the ranks; every rank one step."""
        self.assertIn("evaluation epoch 0: 3 assigned, 3 unique, 0 missing, 0 duplicated", stdout)
        traces = [[json.loads(line) for line in
                   (folder / f"rank-{r}.jsonl").read_text(encoding="utf-8").splitlines()]
                  for r in range(WORLD)]
        self.assertEqual([len(t) for t in traces], [1] * WORLD)
        evaluated = Counter(s for t in traces for m in t if not m.get("stand_in")
                            for s in m["samples"])
        self.assertEqual(evaluated, Counter(f"held_{i}.png" for i in range(EVAL_IMAGES)))
        self.assertEqual(sum(m.get("stand_in", False) for t in traces for m in t),
                         WORLD - EVAL_IMAGES)

    def test_undersized_bucket_stops_every_rank_with_the_message(self):
        # The datasets override train_batch_size, so accumulation makes E too large here.
        config = write_config(self.root, "big.json", gradient_accumulation_steps=16, seed=3)
        results = launch(["--config", str(config), "--output", str(self.root / "audit-big")],
                         WORLD, str(self.private_tmp))
        for rank, (code, out, err) in enumerate(results):
            self.assertNotEqual(code, 0, f"rank {rank} did not fail")
            self.assertIn(f"[rank {rank}] audit stopped: Dataset 'photos'", err)
            self.assertIn("E = 128 (train_batch_size 2 x 4 processes x 16 "
                          "gradient_accumulation_steps)", err)
            self.assertIn("needs repeats >= ", err)
        self.assertFalse((self.root / "audit-big" / "plan.json").exists())

    def test_through_the_launcher_a_stopped_audit_shows_no_traceback(self):
        config = write_config(self.root, "big-launched.json", gradient_accumulation_steps=16,
                              seed=3)
        env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        result = run_bounded(
            [sys.executable, "-m", "simpletuner.launch", "--multi_gpu", "--num_processes", "2",
             "--main_process_port", "0", "-m", "simpletuner.audit", "--config", str(config),
             "--output", str(self.root / "audit-launched")],
            tmpdir=self.private_tmp, timeout=TIMEOUT_S, env=env)
        said = result.stdout + result.stderr
        self.assertEqual(result.returncode, 1, said[-3000:])
        for rank in (0, 1):
            self.assertEqual(said.count(f"[rank {rank}] audit stopped: Dataset 'photos'"), 1,
                             said[-3000:])
        self.assertNotIn("Traceback", said)
        self.assertNotIn("ChildFailedError", said)

    def test_a_rank_that_cannot_load_the_index_fails_every_rank(self):
        # Rank 1 is pointed at another output_dir, where the main rank wrote no index cache.
        good = write_config(self.root, "shared.json", seed=5)
        elsewhere = json.loads(good.read_text())
        elsewhere["output_dir"] = str(self.root / "elsewhere")
        other = self.root / "other.json"
        other.write_text(json.dumps(elsewhere))
        output = str(self.root / "audit-split-brain")
        results = launch(["--config", str(good), "--output", output], 2, str(self.private_tmp),
                         per_rank={1: ["--config", str(other), "--output", output]})
        for rank, (code, _, err) in enumerate(results):
            self.assertNotEqual(code, 0, f"rank {rank} did not fail")
            self.assertIn(f"[rank {rank}] audit stopped: some ranks could not load the bucket "
                          "index", err)
            self.assertIn("rank 1: MetadataCacheError", err)


class IssueCaseOnEightProcessesTest(unittest.TestCase):
    """Issue 22's case in real processes: 100 images, batch 2, 8 ranks (E = 16), three epochs,
    and 2 evaluation images. Every occurrence of every pass is trained exactly once (what an
    epoch cannot fill into a whole effective batch is carried into the next, none dropped),
    and each evaluation image is evaluated once while six ranks run stand-ins."""

    IMAGES, RANKS, EPOCHS, HELD = 100, 8, 3, 2

    def test_every_occurrence_once_and_every_eval_image_once(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "tmp").mkdir()
            for folder, count in (("photos", self.IMAGES), ("held", self.HELD)):
                (root / folder).mkdir()
                for i in range(count):
                    Image.new("RGB", (64, 64), (i * 7 % 256, 90, 160)).save(
                        root / folder / f"{folder}_{i:03d}.png")
            (root / "multidatabackend.json").write_text(json.dumps([
                {"id": "photos", "instance_data_dir": str(root / "photos"),
                 "caption_strategy": "filename"},
                {"id": "held", "dataset_type": "eval", "instance_data_dir": str(root / "held"),
                 "caption_strategy": "filename"}]))
            config = write_config(root, "issue.json", gradient_accumulation_steps=1, seed=11)
            output = root / "audit"
            results = launch(["--config", str(config), "--output", str(output),
                              "--epochs", str(self.EPOCHS)], self.RANKS, str(root / "tmp"))
            for rank, (code, out, err) in enumerate(results):
                self.assertEqual(code, 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}")
            plan = json.loads((output / "plan.json").read_text())
            traces = [[json.loads(line) for line in
                       (output / f"rank-{r}.jsonl").read_text(encoding="utf-8").splitlines()]
                      for r in range(self.RANKS)]
            one_pass = Counter({("photos", f"photos_{i:03d}.png"): 1 for i in range(self.IMAGES)})
            carried = DistributedAuditTest.carried
            for epoch in range(self.EPOCHS):
                got = Counter((m["dataset"], s) for t in traces for m in t
                              if m["epoch"] == epoch for s in m["samples"])
                self.assertEqual(got + carried(plan, epoch), one_pass + carried(plan, epoch - 1),
                                 f"epoch {epoch}")
                self.assertIn(f"epoch {epoch}: ", results[0][1])
            # 100 = 6 x 16 + 4: the first epoch carries 4, the next 8, the third 12.
            self.assertEqual([sum(carried(plan, e).values()) for e in range(self.EPOCHS)],
                             [4, 8, 12])
            self.assertIn("0 missing, 0 duplicated", results[0][1])
            evaluation = [[json.loads(line) for line in (output / "eval" / f"rank-{r}.jsonl")
                           .read_text().splitlines()] for r in range(self.RANKS)]
            evaluated = Counter(s for t in evaluation for m in t if not m.get("stand_in")
                                for s in m["samples"])
            self.assertEqual(evaluated, Counter(f"held_{i:03d}.png" for i in range(self.HELD)))
            self.assertEqual(sum(m.get("stand_in", False) for t in evaluation for m in t),
                             self.RANKS - self.HELD)


if __name__ == "__main__":
    unittest.main()
