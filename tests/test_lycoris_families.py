"""LyCORIS on every family with LoRA: LoKr, LoHa, LoCon and full adapters train on the family's
network, and the exported file, put on a fresh base network by LyCORIS's own
create_lycoris_from_weights, gives the trained network's output; LoCon's conv_dim adapts the
UNets' convolutions; a preset that selects nothing names the module classes."""

from __future__ import annotations

import re
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from model_fixtures import TinyModelCase, network_prediction, random_batch, train_adapter
from trained_outputs import file_data_sha256
from simpletuner.training.checkpointing.tensor_files import save_tensors
from simpletuner.training.adapters.lycoris_adapter import (LycorisTargetError, add_lycoris,
                                                           write_lycoris)

FAMILIES = ("sd1x", "sd2x", "sdxl", "sd3", "flux", "chroma", "qwen_image", "z_image", "flux2",
            "wan")
# Every family's attention projections, by module path (LyCORIS matches target_name as a
# regular expression against the path).
PROJECTIONS = {"target_module": [], "target_name": [r".*\.to_(q|k|v)$"]}
CONFIGS = {"lokr": {"algo": "lokr", "linear_dim": 10000, "linear_alpha": 1, "factor": 4,
                    "apply_preset": PROJECTIONS},
           "loha": {"algo": "loha", "linear_dim": 4, "linear_alpha": 2,
                    "apply_preset": PROJECTIONS},
           "locon": {"algo": "locon", "linear_dim": 4, "linear_alpha": 2,
                     "apply_preset": PROJECTIONS},
           "full": {"algo": "full", "apply_preset": PROJECTIONS}}
# LoCon over the UNets' attention blocks and ResNet blocks: linear layers (and 1x1
# convolutions) at rank 4, alpha 2; 3x3 convolutions at rank 2, alpha 1.
CONV_LOCON = {"algo": "locon", "linear_dim": 4, "linear_alpha": 2, "conv_dim": 2,
              "conv_alpha": 1,
              "apply_preset": {"target_module": ["Transformer2DModel", "ResnetBlock2D"]}}


class LycorisFamiliesTest(TinyModelCase):
    def setUp(self):
        self.output = Path(self.enterContext(tempfile.TemporaryDirectory()))

    def trained_export(self, family: str, config: dict, name: str) -> tuple[Path, int]:
        """Train ``config``'s adapter on ``family``'s network and export it; assert that
        LyCORIS puts it on a fresh base with the trained output. Returns the file and the
        number of modules adapted."""
        from lycoris import create_lycoris_from_weights

        trained = self.load(family)
        batch = random_batch(trained, 2, seed=0, prompts=("a", "b"))
        base = network_prediction(trained, batch)
        torch.manual_seed(0)
        lycoris = add_lycoris(trained.trainable, config, family)
        train_adapter(trained, batch)
        path = write_lycoris(trained.trainable, config, family, self.output / name)
        fresh = self.load(family)
        network, _ = create_lycoris_from_weights(1.0, str(path), fresh.trainable)
        network.apply_to()
        self.assertEqual(len(network.loras), len(lycoris.loras))
        expected = network_prediction(trained, batch)
        self.assertGreater((expected - base).abs().max().item(), 1e-5)
        got = network_prediction(fresh, batch)
        self.assertLessEqual((got - expected).abs().max().item(), 1e-5)
        with safe_open(str(path), "pt") as handle:  # the hash in LyCORIS's form
            self.assertEqual(handle.metadata()["sshs_model_hash"], "0x" + file_data_sha256(path))
            modules = {key.split(".")[0] for key in handle.keys()}
        # ComfyUI's key map (comfy/lora.py model_lora_keys_unet) names each module of a
        # diffusers-named network "lycoris_" + its path with "." as "_".
        comfyui_keys = {"lycoris_" + name.replace(".", "_")
                        for name, _ in fresh.trainable.named_modules() if name}
        self.assertEqual(len(modules), len(lycoris.loras))
        self.assertLessEqual(modules, comfyui_keys, sorted(modules - comfyui_keys)[:3])
        return path, len(lycoris.loras)

    def test_the_export_puts_the_trained_adapter_on_a_fresh_base(self):
        for family in FAMILIES:
            for algo, config in CONFIGS.items():
                with self.subTest(family=family, algo=algo):
                    self.trained_export(family, config, f"{family}-{algo}.safetensors")

    def test_locon_conv_dim_adapts_the_unet_convolutions(self):
        for family in ("sd1x", "sd2x", "sdxl"):
            with self.subTest(family=family):
                path, modules = self.trained_export(family, CONV_LOCON,
                                                    f"{family}-conv.safetensors")
                tensors = load_file(str(path))
                downs = {k[: -len(".lora_down.weight")]: v for k, v in tensors.items()
                         if k.endswith(".lora_down.weight")}
                self.assertEqual(len(downs), modules)
                # LyCORIS gives 1x1 convolutions the linear rank, as kohya's LoCon does
                convs = {k: v for k, v in downs.items() if v.dim() == 4 and v.shape[-1] > 1}
                resnets = [k for k in downs
                           if re.fullmatch(r"lycoris_(down_blocks_\d+|mid_block|up_blocks_\d+)_"
                                           r"resnets_\d+_conv[12]", k)]
                self.assertTrue(resnets, sorted(downs)[:5])
                self.assertTrue(set(resnets) <= set(convs))
                for key, down in downs.items():
                    rank, alpha = (2, 1.0) if key in convs else (4, 2.0)
                    self.assertEqual(down.shape[0], rank, key)
                    self.assertEqual(tensors[key + ".alpha"].item(), alpha, key)

    def test_enable_conv_false_leaves_the_3x3_convolutions_alone(self):
        for enable_conv in (True, False):
            with self.subTest(enable_conv=enable_conv):
                preset = {"target_module": ["ResnetBlock2D"], "enable_conv": enable_conv}
                lycoris = add_lycoris(self.load("sd1x").trainable,
                                      dict(CONV_LOCON, apply_preset=preset), "sd1x")
                kernels = {getattr(m.org_module[0], "kernel_size", None) for m in lycoris.loras}
                self.assertIn(None, kernels)  # the ResNet blocks' time-embedding Linear
                self.assertEqual((3, 3) in kernels, enable_conv, kernels)

    def test_lokr_trains_on_a_quantized_base_and_loads_back(self):
        """torchao's layers only in bypass mode (check refuses the other); LyCORIS turns it on
        itself for quanto's and bitsandbytes' NF4 layers."""
        from simpletuner.training.adapters.lora import adapter_state_dict, load_adapter_weights
        from simpletuner.training.memory.quantization import PRECISIONS

        for precision, bypass in (("int8-quanto", False), ("int8-torchao", True),
                                  ("nf4-bnb", False)):
            with self.subTest(precision=precision):
                config = dict(CONFIGS["lokr"], bypass_mode=bypass)
                adapters = []
                for _ in range(2):
                    adapter = self.load("sd1x")
                    PRECISIONS[precision].quantize(adapter.trainable.requires_grad_(False),
                                                   torch.float32)
                    add_lycoris(adapter.trainable, config, "sd1x")
                    adapters.append(adapter)
                trained, fresh = adapters
                batch = random_batch(trained, 2, seed=0, prompts=("a", "b"))
                base = network_prediction(trained, batch)
                train_adapter(trained, batch)
                expected = network_prediction(trained, batch)
                path = self.output / f"{precision}.safetensors"
                save_tensors(adapter_state_dict(trained.trainable), path)
                load_adapter_weights(fresh.trainable, path)
                self.assertGreater((expected - base).abs().max().item(), 1e-4)
                self.assertLessEqual(
                    (network_prediction(fresh, batch) - expected).abs().max().item(), 1e-6)

    def test_a_preset_that_selects_nothing_names_the_module_classes(self):
        adapter = self.load("sd1x")
        with self.assertRaises(LycorisTargetError) as caught:
            add_lycoris(adapter.trainable, {"algo": "lokr",
                                            "apply_preset": {"target_module": ["NoSuchBlock"]}},
                        "sd1x")
        for fragment in ("sd1x", "UNet2DConditionModel", "target_module", "Attention"):
            self.assertIn(fragment, str(caught.exception))
        self.assertFalse(hasattr(adapter.trainable, "lycoris"))


if __name__ == "__main__":
    unittest.main()
