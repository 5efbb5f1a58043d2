"""`python -m simpletuner plan --memory` on a Flux-dev-sized model folder (configs only, as the
published ones): the table a user reads, with the sizes the published parameter counts give."""

from __future__ import annotations

import io
import json
import re
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

import torch

from simpletuner.cli import main
from simpletuner.configuration.options import TrainingConfig
from simpletuner.training.memory.model import rank_bytes
from simpletuner.training.memory.shards import WHOLE, RankPart
from launching import run_bounded
from training_fixtures import environment, make_shapes, write_config

GIB = 1 << 30
FLUX_DEV_PARAMETERS = 11.89e9  # published
SDXL_BASE_UNET = dict(
    sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D",
                                       "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    block_out_channels=(320, 640, 1280), layers_per_block=2, cross_attention_dim=2048,
    transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
    use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=256,
    projection_class_embeddings_input_dim=2816)


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


def plan_command(tmp: str, num_processes: int, **options) -> str:
    """plan --memory's output for a Flux-dev folder under ``options``."""
    root = Path(tmp)
    make_shapes(root / "data", per_size=1, sizes=((64, 64),))
    folder = root / "flux-dev" if (root / "flux-dev").exists() else write_flux_dev_folder(root)
    config = write_config(root, root / "data", model_family="flux",
                          pretrained_model_name_or_path=str(folder), mixed_precision="bf16",
                          **options)
    result = run_bounded(
        [sys.executable, "-m", "simpletuner", "plan", "--memory", "--config", str(config),
         "--num-processes", str(num_processes)], tmpdir=tmp, timeout=300, env=environment(tmp))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def plan_in_process(config: Path, num_processes: int = 8) -> str:
    """plan --memory's output for ``config``, through the CLI's main in this process: the
    command line itself is plan_command's to test, the others need no interpreter start-up."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        status = main(["plan", "--memory", "--config", str(config),
                       "--num-processes", str(num_processes)])
    assert status == 0, f"plan --memory exited {status}: {printed.getvalue()[-3000:]}"
    return printed.getvalue()


def row(output: str, label: str, after: str | None = None) -> list[float]:
    """The GiB figures of the first row called ``label`` (after the line ``after``)."""
    lines = output.splitlines()
    start = lines.index(after) if after else 0
    line = next(l for l in lines[start:] if l.strip().startswith(label))
    figures = re.findall(r"([0-9.]+) (GiB|MiB|KiB|B)\b", line[len(label) + 2:])
    scale = {"GiB": 1, "MiB": 1 / 1024, "KiB": 1 / 1024 ** 2, "B": 1 / GIB}
    return [float(value) * scale[unit] for value, unit in figures]


class FluxDevPlanCommandTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = cls.enterClassContext(tempfile.TemporaryDirectory(prefix="st-memory-cli-"))
        cls.full = plan_command(cls.tmp, 8, use_ema=True)
        cls.lean = plan_command(  # README's single-GPU LoRA config
            cls.tmp, 1, model_type="lora", base_model_precision="int8-torchao",
            text_encoder_2_precision="int8-quanto", optimizer="adamw_bf16",
            frozen_components_after_caching="keep")

    def test_full_training_counts_float32_weights_gradients_moments_and_ema(self):
        self.assertIn("11.89 B parameters", self.full)
        weights = FLUX_DEV_PARAMETERS * 4 / GIB
        ddp, fsdp = row(self.full, "gradients")
        self.assertAlmostEqual(ddp / weights, 1, delta=0.001)
        self.assertAlmostEqual(row(self.full, "optimizer state (adamw)")[0] / weights, 2,
                               delta=0.001)
        self.assertAlmostEqual(row(self.full, "EMA (float32)")[0] / weights, 1, delta=0.001)
        self.assertAlmostEqual(fsdp / ddp, 1 / 8, delta=0.001)

    def test_fsdp_peak_is_the_unsharded_network_while_caching(self):
        caching = row(self.full, "total", after="while the caches are built")
        training = row(self.full, "total", after="while training")
        self.assertEqual(row(self.full, "peak per rank"), [training[0], caching[1]])
        self.assertGreater(caching[1], FLUX_DEV_PARAMETERS * 4 / GIB)

    def test_lean_lora_is_an_int8_base_and_bf16_adapter_state(self):
        frozen = row(self.lean, "frozen network")[0]
        self.assertAlmostEqual(frozen / (FLUX_DEV_PARAMETERS / GIB), 1, delta=0.01)
        self.assertIn("int8-torchao", self.lean)
        trainable = row(self.lean, "trainable parameters")[0]
        self.assertAlmostEqual(row(self.lean, "optimizer state (adamw_bf16)")[0] / trainable,
                               3, delta=0.01)  # two moments and the Kahan compensation
        self.assertEqual(row(self.lean, "EMA (float32)"), [0.0])
        # kept: T5 (4.76 B parameters) in int8 plus the bf16 VAE and CLIP, about 4.9 GiB
        self.assertGreater(row(self.lean, "VAE + text encoders (keep)")[0], 4.4)
        self.assertIn("FSDP2 is not planned: base_model_precision int8-torchao", self.lean)
        self.assertIn("activations: not estimated; they need the model folder's tokenizer/, "
                      "tokenizer_2/, scheduler/", self.lean)


class PublishedSizesTest(unittest.TestCase):
    def test_flux_dev_transformer(self):
        from diffusers import FluxTransformer2DModel
        with torch.device("meta"):
            count = sum(p.numel() for p in FluxTransformer2DModel().parameters())
        self.assertEqual(round(count / 1e9, 2), round(FLUX_DEV_PARAMETERS / 1e9, 2))

    def test_sdxl_base_unet(self):
        from diffusers import UNet2DConditionModel
        with torch.device("meta"):
            count = sum(p.numel() for p in UNet2DConditionModel(**SDXL_BASE_UNET).parameters())
        self.assertEqual(round(count / 1e9, 2), 2.57)

    def test_fsdp_at_eight_shards_a_flux_sized_network_eightfold(self):
        from diffusers import FluxTransformer2DModel
        with torch.device("meta"):
            network = FluxTransformer2DModel()
        training = TrainingConfig(model_family="flux", pretrained_model_name_or_path="unused",
                                  output_dir="unused", data_backend_config="unused",
                                  use_ema=True)
        ddp = rank_bytes(network, training, WHOLE, {})
        worst = max((rank_bytes(network, training, RankPart(r, 8, sharded=True), {})
                     for r in range(8)), key=lambda held: held.while_training)
        self.assertEqual(ddp.gradients, 4 * sum(p.numel() for p in network.parameters()))
        self.assertAlmostEqual(worst.while_training / ddp.while_training, 1 / 8, delta=0.01)


if __name__ == "__main__":
    unittest.main()
