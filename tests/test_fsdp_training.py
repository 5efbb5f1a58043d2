"""FSDP2 on CPU: two real gloo processes, against two DDP processes on the same data and seed
(both runs by the processes of one launch; a resumed run through ./train.sh). Weights after the same optimizer steps must agree (fp32), a sharded
checkpoint holds one shard per rank of about half the bytes, a resumed run ends where the
uninterrupted one did, and the export loads and generates."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from training_fixtures import (make_shapes, read_events, read_jsonl, run_sequence,
                               run_train_sh, write_config)

UNET_WEIGHTS = "pipeline/unet/diffusion_pytorch_model.safetensors"
TRANSFORMER_WEIGHTS = "pipeline/transformer/diffusion_pytorch_model.safetensors"
LORA_WEIGHTS = "lora/pytorch_lora_weights.safetensors"


def largest_difference(a: Path, b: Path) -> float:
    first, second = load_file(str(a)), load_file(str(b))
    if set(first) != set(second):
        raise AssertionError(f"{a} and {b} hold different tensors")
    return max(float((first[k].float() - second[k].float()).abs().max()) for k in first)


def tensor_bytes(path: Path) -> int:
    with safe_open(str(path), framework="pt") as handle:
        tensors = [handle.get_tensor(k) for k in handle.keys()]
    return sum(t.numel() * t.element_size() for t in tensors)


class DdpFsdpPair:
    """Mixed into a TestCase: a DDP run and an FSDP2 run of ``options``, two processes each,
    trained one after the other by the two processes of one launch."""

    options: dict
    weights: str
    extra_fsdp_runs: bool = False  # also a run resumed under FSDP2 from checkpoint-2
    evaluated_images: int = 0      # an eval dataset of this many, evaluated every 2 steps
    datasets: list | None = None   # the default: the 'shapes' folder alone

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-fsdp-")
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=4)
        common = dict(num_processes=2, max_train_steps=4, checkpointing_steps=2,
                      trace_samples=True, **cls.options)
        if cls.evaluated_images:
            make_shapes(cls.root / "held-out", per_size=cls.evaluated_images, sizes=((64, 64),))
            cls.datasets = [{"id": "shapes", "instance_data_dir": str(cls.root / "data")},
                            {"id": "held-out", "dataset_type": "eval",
                             "instance_data_dir": str(cls.root / "held-out")}]
            common["eval_steps_interval"] = 2
        cls.pair = run_sequence([cls.config("ddp", **common),
                                 cls.config("fsdp", fsdp_enable=True, **common)], cls.tmp)
        if cls.extra_fsdp_runs and cls.pair.returncode == 0:
            # Through ./train.sh: FSDP2's launch as users start it.
            resumed = cls.root / "resumed-out"
            resumed.mkdir()
            shutil.copytree(cls.root / "fsdp-out/checkpoint-2", resumed / "checkpoint-2")
            cls.resumed = run_train_sh(cls.config("resumed", fsdp_enable=True,
                                                  resume_from_checkpoint="latest", **common),
                                       cls.tmp)

    @classmethod
    def config(cls, name: str, **options) -> Path:
        return write_config(cls.root, cls.root / "data", name, datasets=cls.datasets, **options)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def out(self, name: str) -> Path:
        return self.root / f"{name}-out"

    def test_both_runs_succeed(self):
        self.assertEqual(self.pair.returncode, 0, self.pair.stderr[-4000:])
        for name in ("ddp", "fsdp"):
            self.assertTrue((self.out(name) / self.weights).is_file(), name)

    def test_fsdp_weights_equal_ddp_weights(self):
        difference = largest_difference(self.out("ddp") / self.weights,
                                        self.out("fsdp") / self.weights)
        self.assertLessEqual(difference, 1e-5)

    def test_the_weights_moved_between_checkpoints(self):
        # Equal weights mean nothing if neither run trained.
        shards = [next((self.out("fsdp") / f"checkpoint-{step}").glob("shard-00001-*"))
                  for step in (2, 4)]
        first, second = (load_file(str(path)) for path in shards)
        moved = [k for k in first if k.startswith("model.") and not torch.equal(first[k], second[k])]
        self.assertTrue(moved)

    def test_each_rank_holds_about_half_of_the_weights_and_optimizer_state(self):
        whole = sum(tensor_bytes(path) for path in (self.out("ddp") / "checkpoint-4").glob(
            "*.safetensors"))
        shards = sorted((self.out("fsdp") / "checkpoint-4").glob("shard-*.safetensors"))
        self.assertEqual(len(shards), 2)  # one per rank, and no pickled .metadata/.distcp
        self.assertEqual(sorted(p.name for p in (self.out("fsdp") / "checkpoint-4").iterdir()
                                if p.suffix in (".distcp", ".metadata", ".pt")), [])
        for path in shards:
            self.assertAlmostEqual(tensor_bytes(path) / whole, 0.5, delta=0.05, msg=path.name)


class Sd1xFullFsdpTest(DdpFsdpPair, unittest.TestCase):
    options = {"use_ema": True, "validation_prompt": "a red circle", "validation_resolution": 64,
               "validation_num_inference_steps": 1}
    weights = UNET_WEIGHTS
    extra_fsdp_runs = True

    def test_validation_ran_on_the_gathered_network(self):
        self.assertTrue(list((self.out("fsdp") / "validation/step-4").glob("*.png")))

    def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights_and_trace(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-4000:])
        self.assertLessEqual(largest_difference(self.out("fsdp") / self.weights,
                                                self.out("resumed") / self.weights), 1e-6)
        for rank in (0, 1):
            whole = read_jsonl(self.out("fsdp") / f"trace/rank-{rank}.jsonl")
            tail = read_jsonl(self.out("resumed") / f"trace/rank-{rank}.jsonl")
            self.assertEqual([r["samples"] for r in tail], [r["samples"] for r in whole[-2:]])

    def test_the_export_loads_and_generates(self):
        from diffusers import DiffusionPipeline
        pipeline = DiffusionPipeline.from_pretrained(self.out("fsdp") / "pipeline")
        image = pipeline("a red circle", num_inference_steps=2, height=64, width=64,
                         generator=torch.Generator().manual_seed(0), output_type="np").images[0]
        self.assertEqual(image.shape, (64, 64, 3))
        self.assertTrue(bool((image == image).all()))  # no NaN


class Sd1xFullStateDictTest(unittest.TestCase):
    """fsdp_state_dict_type FULL_STATE_DICT: the main rank writes the gathered whole, and a
    run resumed from it ends where the uninterrupted one did."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-fsdp-full-")
        cls.root = root = Path(cls.tmp)
        make_shapes(root / "data", per_size=4)
        common = dict(num_processes=2, max_train_steps=4, checkpointing_steps=2, use_ema=True,
                      fsdp_enable=True, fsdp_state_dict_type="FULL_STATE_DICT")
        cls.full = run_train_sh(write_config(root, root / "data", "full", **common), cls.tmp)
        if cls.full.returncode == 0:
            (root / "resumed-out").mkdir()
            shutil.copytree(root / "full-out/checkpoint-2", root / "resumed-out/checkpoint-2")
            cls.resumed = run_train_sh(write_config(
                root, root / "data", "resumed", resume_from_checkpoint="latest", **common),
                cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_checkpoint_holds_whole_tensors_and_no_shards(self):
        self.assertEqual(self.full.returncode, 0, self.full.stderr[-4000:])
        folder = self.root / "full-out/checkpoint-2"
        names = {path.name for path in folder.glob("*.safetensors")}
        self.assertEqual(names, {"model.safetensors", "optimizer.safetensors", "ema.safetensors"})
        whole = sum(p.numel() for p in load_file(str(folder / "model.safetensors")).values())
        ema = sum(p.numel() for p in load_file(str(folder / "ema.safetensors")).values())
        self.assertEqual(whole, ema)

    def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-4000:])
        self.assertLessEqual(largest_difference(self.root / "full-out" / UNET_WEIGHTS,
                                                self.root / "resumed-out" / UNET_WEIGHTS), 1e-6)


class Sd1xLoraFsdpTest(DdpFsdpPair, unittest.TestCase):
    # Accumulation: FSDP2 holds back its reduce-scatter as DDP's no_sync holds its all-reduce.
    options = {"model_type": "lora", "lora_rank": 4, "train_batch_size": 1,
               "gradient_accumulation_steps": 2, "gradient_checkpointing": True}
    weights = LORA_WEIGHTS
    # One image on two ranks: rank 1 runs a stand-in, so both make the sharded network's
    # all-gathers; a rank without a forward pass would leave the other waiting.
    evaluated_images = 1

    def test_a_one_image_evaluation_runs_sharded_and_equals_ddps(self):
        losses = [[(line["step"], line["eval_loss"]) for line in
                   read_events(self.out(name), "eval")] for name in ("ddp", "fsdp")]
        self.assertEqual([step for step, _ in losses[1]], [2, 4])
        for (_, ddp), (_, fsdp) in zip(*losses):
            self.assertAlmostEqual(fsdp, ddp, delta=1e-4 * abs(ddp))


class FluxFullFsdpTest(DdpFsdpPair, unittest.TestCase):
    options = {"model_family": "flux", "pretrained_model_name_or_path": "builtin:tiny-flux",
               "gradient_checkpointing": True}
    weights = TRANSFORMER_WEIGHTS


class FluxLoraFsdpTest(DdpFsdpPair, unittest.TestCase):
    options = {"model_family": "flux", "pretrained_model_name_or_path": "builtin:tiny-flux",
               "model_type": "lora", "lora_rank": 4}
    weights = LORA_WEIGHTS


class ChromaFullFsdpTest(DdpFsdpPair, unittest.TestCase):
    # gradient_checkpointing: Chroma's own per-block checkpoint under fully_shard.
    options = {"model_family": "chroma", "pretrained_model_name_or_path": "builtin:tiny-chroma",
               "gradient_checkpointing": True}
    weights = TRANSFORMER_WEIGHTS


class QwenImageFullFsdpTest(DdpFsdpPair, unittest.TestCase):
    # Its last block's text stream gets no gradient: DDP runs with find_unused_parameters.
    options = {"model_family": "qwen_image",
               "pretrained_model_name_or_path": "builtin:tiny-qwen_image",
               "gradient_checkpointing": True}
    weights = TRANSFORMER_WEIGHTS


class Flux2FullFsdpTest(DdpFsdpPair, unittest.TestCase):
    # gradient_checkpointing: FLUX.2's double- and single-stream blocks under fully_shard.
    options = {"model_family": "flux2", "pretrained_model_name_or_path": "builtin:tiny-flux2",
               "gradient_checkpointing": True}
    weights = TRANSFORMER_WEIGHTS


if __name__ == "__main__":
    unittest.main()
