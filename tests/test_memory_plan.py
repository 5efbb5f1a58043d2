"""plan --memory: predicted bytes per rank equal the bytes of the tensors the trainer really
holds after set-up, for every built-in model, full and LoRA, unsharded (DDP) and under FSDP2
on two real gloo processes; real-size configurations give their published parameter counts."""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path
from types import SimpleNamespace

import torch

from simpletuner.training.memory.plan import frozen_component_bytes, meta_network, rank_bytes
from simpletuner.models.builtin import resolve_model_path
from simpletuner.models.registry import get_adapter_class
from launching import run_bounded
from training_fixtures import environment

RUNNER = Path(__file__).with_name("memory_measure_runner.py")
CASES = [{"family": family, "lora": lora, "precision": "bf16" if lora else "no"}
         for family in ("sd1x", "sd2x", "sdxl", "sd3", "flux") for lora in (False, True)]
SDXL_BASE_UNET = dict(
    sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                                       "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(320, 640, 1280), layers_per_block=2, cross_attention_dim=2048,
    transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816)


def predicted(case: dict, rank: int, world: int, sharded: bool):
    adapter_class = get_adapter_class(case["family"])
    folder = resolve_model_path(f"builtin:tiny-{case['family']}")
    training = SimpleNamespace(model_type="lora" if case["lora"] else "full", lora_rank=4,
                               lora_alpha=None, lora_dropout=0.0, lora_target_modules=None)
    return rank_bytes(meta_network(adapter_class, folder, training), rank=rank, world=world,
                      sharded=sharded, use_ema=True,
                      frozen_components=frozen_component_bytes(adapter_class, folder,
                                                               case["precision"]))


class PredictedEqualsHeldTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="st-memory-")
        out = Path(cls.tmp.name) / "measured"
        cls.result = run_bounded(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
             "2", RUNNER, out, json.dumps(CASES)], tmpdir=cls.tmp.name,
            env=environment(cls.tmp.name), timeout=400)
        cls.measured = [json.loads((out / f"rank-{r}.json").read_text()) if
                        (out / f"rank-{r}.json").exists() else None for r in (0, 1)]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_builtin_and_setting(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-3000:])
        for rank in (0, 1):
            for case, measured in zip(CASES, self.measured[rank]):
                for layout, sharded in (("ddp", False), ("fsdp", True)):
                    with self.subTest(rank=rank, layout=layout, **case):
                        plan = predicted(case, rank, 2, sharded)
                        held = measured[layout]
                        self.assertEqual(dict(plan.trainable), held["trainable"])
                        self.assertEqual({k: v for k, v in plan.frozen.items() if v},
                                         held["frozen"])
                        self.assertEqual(plan.gradients, held["gradients"])
                        self.assertEqual(plan.optimizer, held["optimizer"])
                        self.assertEqual(plan.ema, held["ema"])
                        self.assertEqual(dict(plan.frozen_components), held["frozen_components"])

    def test_fsdp_ranks_hold_about_half(self):
        for rank in (0, 1):
            for case, held in zip(CASES, self.measured[rank]):
                for part in ("gradients", "optimizer", "ema"):
                    self.assertAlmostEqual(held["fsdp"][part] / held["ddp"][part], 0.5,
                                           delta=0.05, msg=f"rank {rank} {part} {case}")


FLUX_DEV_CONFIGS = {  # Flux-dev's published configs, the parts that size its tensors
    "transformer": {"_class_name": "FluxTransformer2DModel"},  # its defaults are Flux-dev
    "vae": {"_class_name": "AutoencoderKL", "latent_channels": 16, "layers_per_block": 2,
            "block_out_channels": [128, 256, 512, 512], "use_quant_conv": False,
            "down_block_types": ["DownEncoderBlock2D"] * 4, "use_post_quant_conv": False,
            "up_block_types": ["UpDecoderBlock2D"] * 4},
    "text_encoder": {"model_type": "clip_text_model", "hidden_size": 768, "projection_dim": 768,
                     "intermediate_size": 3072, "num_attention_heads": 12,
                     "num_hidden_layers": 12},
    "text_encoder_2": {"model_type": "t5", "d_model": 4096, "d_ff": 10240, "d_kv": 64,
                       "num_heads": 64, "num_layers": 24, "vocab_size": 32128,
                       "feed_forward_proj": "gated-gelu"},
}


def write_flux_dev_folder(root: Path) -> Path:
    for subfolder, config in FLUX_DEV_CONFIGS.items():
        (root / "flux-dev" / subfolder).mkdir(parents=True)
        (root / "flux-dev" / subfolder / "config.json").write_text(json.dumps(config))
    return root / "flux-dev"


class FluxSizedPlanCommandTest(unittest.TestCase):
    def test_plan_memory_prints_a_per_gpu_table_for_eight_processes(self):
        from training_fixtures import make_shapes, write_config
        with tempfile.TemporaryDirectory(prefix="st-memory-cli-") as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", model_family="flux",
                                  pretrained_model_name_or_path=str(write_flux_dev_folder(root)),
                                  mixed_precision="bf16", use_ema=True)
            result = run_bounded(
                [sys.executable, "-m", "simpletuner", "plan", "--memory", "--config", config,
                 "--num-processes", "8"], tmpdir=tmp, env=environment(tmp), timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-3000:])
        self.assertIn("11.89 B parameters", result.stdout)
        self.assertIn("FSDP2 (x8)", result.stdout)
        self.assertIn("Activations are not included", result.stdout)
        ddp_total, fsdp_total = result.stdout.split("total per rank")[1].split()[0:4:2]
        self.assertGreater(float(ddp_total), 6 * float(fsdp_total))  # both in GiB here


class PublishedSizesTest(unittest.TestCase):
    def test_flux_dev_transformer(self):
        from diffusers import FluxTransformer2DModel
        with torch.device("meta"):
            count = sum(p.numel() for p in FluxTransformer2DModel().parameters())
        self.assertEqual(round(count / 1e9, 2), 11.89)

    def test_sdxl_base_unet(self):
        from diffusers import UNet2DConditionModel
        with torch.device("meta"):
            count = sum(p.numel() for p in UNet2DConditionModel(**SDXL_BASE_UNET).parameters())
        self.assertEqual(round(count / 1e9, 2), 2.57)

    def test_fsdp_at_eight_shards_a_flux_sized_network_eightfold(self):
        from diffusers import FluxTransformer2DModel
        with torch.device("meta"):
            network = FluxTransformer2DModel()
        ddp = rank_bytes(network, rank=0, world=8, sharded=False, use_ema=True,
                         frozen_components={})
        worst = max((rank_bytes(network, rank=r, world=8, sharded=True, use_ema=True,
                                frozen_components={}) for r in range(8)),
                    key=lambda held: held.total)
        self.assertEqual(ddp.gradients, 4 * sum(p.numel() for p in network.parameters()))
        self.assertAlmostEqual(worst.total / ddp.total, 1 / 8, delta=0.01)


if __name__ == "__main__":
    unittest.main()
