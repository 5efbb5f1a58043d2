"""context_parallel_size: W processes as D = W / C data-parallel groups of C ranks.

Pure: every rank of a grid of (W, C) simulated in one process through the real start-up's
sampler; the C ranks of a group get the same micro-batches and noise, and the groups split each
epoch exactly as D data-parallel ranks would. The audit's check catches a rank of a group that
trained something else. Real processes: one 4-process audit with C=2 (gloo).
"""

from __future__ import annotations

import io
import json
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import torch

from discovery_fixtures import dataset_config, encode, image, training_config, write
from test_distributed import launch, make_datasets, write_config
from test_memory_plan_command import row
from training_fixtures import make_shapes
from training_fixtures import write_config as write_training_config
from simpletuner.audit import audit_plan
from simpletuner.cli import main
from simpletuner.configuration import ConfigError, configuration_from_data
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.mesh import Mesh
from simpletuner.helpers.metadata.startup import DataStartup, build_sampler, run_mesh
from simpletuner.helpers.multiaspect.trace import trace_record
from simpletuner.helpers.multiaspect.verify import verify
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.planning import run_plan
from simpletuner.training.parallel.sequence import sequence_problem
from simpletuner.training.run.launch_checks import static_problems
from simpletuner.training.run_state import noise_generator

EPOCHS = 2
# a family with sequence-parallel attention (its spec's attention_heads_key); 2 heads
FLUX = dict(model_family="flux", pretrained_model_name_or_path="builtin:tiny-flux")
GRID = [(w, c) for w in (1, 2, 3, 4, 6) for c in range(1, w + 1) if w % c == 0]


class MeshGridTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        root = Path(cls._tmp.name)
        for i in range(29):  # two buckets (x3 repeats), neither a multiple of any E below
            size = (64, 64) if i % 3 else (64, 96)
            write(root / "data", f"{i:02d}.png", encode(image(*size, seed=i), "PNG"))
        cls.root = root
        backend = cls.backend(1)
        cls.index = backend.refresh_index(show_progress=False)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    @classmethod
    def backend(cls, context_parallel: int) -> MetadataBackend:
        training = training_config(cls.root / "out", train_batch_size=2,
                                   gradient_accumulation_steps=2,
                                   context_parallel_size=context_parallel)
        return MetadataBackend.from_config(
            dataset_config(cls.root / "data", caption_strategy="filename", repeats=2), training)

    def samplers(self, world: int, context_parallel: int) -> tuple[DataStartup, list]:
        backend = self.backend(context_parallel)
        startup = DataStartup({"photos": backend}, {"photos": self.index}, 11, False, [])
        return startup, [build_sampler(startup, backend.training,
                                       SimpleNamespace(num_processes=world, process_index=rank))
                         for rank in range(world)]

    @staticmethod
    def walk(sampler, group: int | None) -> list[dict]:
        return [trace_record(sampler.plan(epoch, step), group) for epoch in range(EPOCHS)
                for step in range(sampler.micro_batches_in(epoch))]

    def test_groups_train_alike_and_split_like_data_parallel_ranks(self):
        for world, c in GRID:
            with self.subTest(world=world, context_parallel=c):
                mesh = Mesh(world, c)
                startup, samplers = self.samplers(world, c)
                _, data_parallel = self.samplers(mesh.data_parallel, 1)
                traces = {rank: self.walk(s, mesh.group_of(rank) if c > 1 else None)
                          for rank, s in enumerate(samplers)}
                for group in range(mesh.data_parallel):
                    alone = self.walk(data_parallel[group], None)
                    self.assertGreater(len(alone), 0)
                    for rank in mesh.ranks_of(group):
                        got = [{k: v for k, v in r.items() if k != "group"} for r in traces[rank]]
                        self.assertEqual(got, alone, f"rank {rank} of group {group}")
                        self.assertEqual({r.get("group") for r in traces[rank]},
                                         {group if c > 1 else None})
                report = verify(audit_plan(startup, samplers[0], EPOCHS), traces)
                self.assertTrue(report.ok, report.lines())
                assigned = sum(len(r["samples"]) for g in range(mesh.data_parallel)
                               for r in traces[g * c])
                self.assertEqual(sum(e.assigned for e in report.epochs), assigned)

    def test_a_group_draws_one_noise_and_the_groups_differ(self):
        _, samplers = self.samplers(4, 2)
        draws = [torch.randn(8, generator=noise_generator(11, s.rank, 0, 3)) for s in samplers]
        self.assertTrue(torch.equal(draws[0], draws[1]))
        self.assertTrue(torch.equal(draws[2], draws[3]))
        self.assertFalse(torch.equal(draws[0], draws[2]))

    def test_the_audit_names_a_rank_that_trained_other_samples_than_its_group(self):
        startup, samplers = self.samplers(4, 2)
        traces = {rank: self.walk(s, rank // 2) for rank, s in enumerate(samplers)}
        traces[3][1] = dict(traces[3][1], samples=traces[1][1]["samples"])
        report = verify(audit_plan(startup, samplers[0], EPOCHS), traces)
        self.assertFalse(report.ok)
        self.assertTrue(any("context-parallel group 1: rank 3 did not train what rank 2"
                            in p for p in report.problems), report.problems)

    def test_resuming_with_another_layout_is_the_one_warning_naming_it(self):
        _, (saved, *_) = self.samplers(4, 2)
        _, (resumed, *_) = self.samplers(4, 1)
        with self.assertLogs("simpletuner.helpers.multiaspect.sampler", "WARNING") as logs:
            resumed.load_state_dict(json.loads(json.dumps(saved.state_dict())))
        self.assertEqual(len(logs.records), 1)
        message = logs.records[0].getMessage()
        self.assertIn("processes: 2 -> 4", message)
        self.assertIn("context_parallel removed", message)


class MeshChecksTest(unittest.TestCase):
    def test_check_and_launch_refuse_a_size_that_does_not_divide_the_processes(self):
        with self.assertRaises(ConfigError) as caught:
            configuration_from_data(
                {**FLUX, "output_dir": "out", "num_processes": 4, "context_parallel_size": 3},
                [{"id": "a", "instance_data_dir": "a"}], base=Path(tempfile.gettempdir()))
        (record,) = [r for r in caught.exception.records if r.key == "context_parallel_size"]
        self.assertIn("context_parallel_size 3 does not divide the 4 processes", record.message)
        with self.assertRaisesRegex(ConfigError, "context_parallel_size 2 does not divide the 3"):
            run_mesh(training_config(Path("out"), context_parallel_size=2), 3)

    def test_check_refuses_a_family_without_sequence_parallel_attention_or_heads_it_splits(self):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "data").mkdir()

            def problems(**options) -> list[str]:
                try:
                    configuration = configuration_from_data(
                        {"output_dir": str(Path(tmp) / "out"), "max_train_steps": 1,
                         "data_backend_config": "datasets.json", **options},
                        [{"id": "a", "instance_data_dir": str(Path(tmp) / "data")}],
                        base=Path(tmp))
                except ConfigError as exc:
                    return exc.problems
                return [str(p) for p in static_problems(configuration)]

            self.assertIn("model_family 'sd1x' has no sequence-parallel attention here (it has "
                          "for flux and wan)", " ".join(problems(
                              model_family="sd1x", num_processes=2, context_parallel_size=2,
                              pretrained_model_name_or_path="builtin:tiny-sd1x")))
            ensure_builtin_model("tiny-flux")  # its transformer/config.json: 2 heads
            self.assertIn("context_parallel_size 4 does not divide the 2 attention heads",
                          " ".join(problems(num_processes=4, context_parallel_size=4, **FLUX)))
            self.assertEqual(problems(num_processes=4, context_parallel_size=2, **FLUX), [])
            # SimpleTuner's +cp examples leave the processes to the launcher: checked at launch
            self.assertEqual(problems(context_parallel_size=2, **FLUX), [])

    def test_the_memory_plan_holds_a_part_of_the_sequence_per_rank(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_training_config(root, root / "data", model_family="wan",
                                           pretrained_model_name_or_path="builtin:tiny-wan",
                                           gradient_checkpointing=False)
            saved = {}
            for c in (1, 2, 4):
                printed = io.StringIO()
                with redirect_stdout(printed):
                    status = main(["plan", "--memory", "--config", str(config), "--frames", "9",
                                   "--num-processes", "4", "--context-parallel", str(c)])
                self.assertEqual(status, 0, printed.getvalue()[-2000:])
                (saved[c],) = row(printed.getvalue(), "activations (saved for the backward)")
        self.assertLess(saved[2], saved[1])
        self.assertLess(saved[4], saved[2])
        self.assertGreater(saved[4], saved[1] / 4)  # outside the blocks: the whole sequence

    def test_a_sequence_that_does_not_split_is_named_before_diffusers_splits_it(self):
        from diffusers import FluxTransformer2DModel, WanTransformer3DModel
        from diffusers.models.transformers.transformer_wan import WanTransformerBlock

        flux = FluxTransformer2DModel._cp_plan[""]

        def inputs(tokens: int) -> dict:
            return {"hidden_states": torch.zeros(1, tokens, 4), "img_ids": torch.zeros(tokens, 3),
                    "encoder_hidden_states": torch.zeros(1, 6, 8), "txt_ids": torch.zeros(6, 3)}

        self.assertEqual(sequence_problem(flux, FluxTransformer2DModel, (), inputs(15), 2),
                         "hidden_states holds 15")
        self.assertIsNone(sequence_problem(flux, FluxTransformer2DModel, (), inputs(16), 2))
        wan = WanTransformer3DModel._cp_plan["blocks.0"]  # its blocks take it by position
        self.assertEqual(sequence_problem(wan, WanTransformerBlock, (torch.zeros(1, 27, 8),),
                                          {}, 2), "hidden_states holds 27")
        self.assertIsNone(sequence_problem(wan, WanTransformerBlock, (torch.zeros(1, 27, 8),),
                                           {}, 3))

    def test_plan_shows_the_data_parallel_groups(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_datasets(root)
            config = write_config(root, "config.json")
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                status = run_plan(str(config), num_processes=8, context_parallel=2)
                refused = run_plan(str(config), num_processes=8, context_parallel=3)
        self.assertEqual(status, 0, err.getvalue()[-2000:])
        self.assertIn("split over 4 data-parallel groups (8 processes, context_parallel_size 2)",
                      out.getvalue())
        self.assertEqual(refused, 2)
        self.assertIn("context_parallel_size 3 does not divide the 8 processes", err.getvalue())


class ContextParallelAuditTest(unittest.TestCase):
    """One real 4-process audit, C=2: both checks of the audit, and the traces themselves."""

    def test_four_processes_as_two_groups_of_two(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "tmp").mkdir()
            make_datasets(root)
            config = write_config(root, "config.json", seed=3, context_parallel_size=2,
                                  num_processes=4, **FLUX)
            output = root / "audit"
            results = launch(["--config", str(config), "--output", str(output), "--epochs", "2"],
                             4, str(root / "tmp"))
            for rank, (code, out, err) in enumerate(results):
                self.assertEqual(code, 0, f"rank {rank}:\n{out}\n{err[-3000:]}")
            plan = json.loads((output / "plan.json").read_text())
            traces = [[json.loads(line) for line in
                       (output / f"rank-{r}.jsonl").read_text().splitlines()] for r in range(4)]
        self.assertEqual((plan["world_size"], plan["context_parallel"]), (2, 2))
        self.assertIn("4 processes as 2 data-parallel groups x 2 context-parallel ranks",
                      results[0][1])
        self.assertIn("epoch 1: ", results[0][1])
        self.assertIn(" 0 missing, 0 duplicated", results[0][1])
        self.assertIn("OK: every kept occurrence assigned exactly once", results[0][1])
        for rank, trace in enumerate(traces):
            self.assertEqual({r["group"] for r in trace}, {rank // 2})
        strip = [[{k: v for k, v in r.items() if k != "group"} for r in t] for t in traces]
        self.assertEqual(strip[0], strip[1])
        self.assertEqual(strip[2], strip[3])
        self.assertNotEqual([r["samples"] for r in strip[0]], [r["samples"] for r in strip[2]])


if __name__ == "__main__":
    unittest.main()
