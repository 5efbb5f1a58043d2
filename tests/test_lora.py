"""LoRA through peft: only the adapter trains, bad targets are named, adapter-only checkpoints
round-trip, and the export is what diffusers' load_lora_weights puts on the base pipeline."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import DiffusionPipeline
from safetensors.torch import load_file

from model_fixtures import TinyModelCase, random_batch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.training.adapters.lora import (
    CHECKPOINT_WEIGHTS, LoraTargetError, add_lora, adapter_state_dict, export_lora,
    load_adapter_weights, save_adapter_weights)
from simpletuner.training.checkpointing.tensor_state import load_weights, save_weights

class LoraCase(TinyModelCase):
    def setUp(self):
        self.output = Path(self.enterContext(tempfile.TemporaryDirectory()))

    def train(self, adapter, steps: int = 3):
        batch = random_batch(adapter, 2, seed=0, prompts=("a", "b"))
        optimizer = torch.optim.AdamW(
            [p for p in adapter.trainable.parameters() if p.requires_grad], lr=1e-2)
        for step in range(steps):
            adapter.compute_loss(batch, torch.Generator().manual_seed(step)).backward()
            optimizer.step()
            optimizer.zero_grad()


class InjectionTest(LoraCase):
    def test_only_adapter_weights_train_and_every_default_target_is_wrapped(self):
        for family in ("sd1x", "sdxl", "sd3", "flux"):
            with self.subTest(family=family):
                adapter = self.load(family)
                network = adapter.trainable
                base = {n: p.detach().clone() for n, p in network.named_parameters()}
                add_lora(network, type(adapter), rank=4)
                trainable = [n for n, p in network.named_parameters() if p.requires_grad]
                self.assertTrue(trainable)
                self.assertTrue(all(".lora_A." in n or ".lora_B." in n for n in trainable))
                for target in type(adapter).lora_target_modules:
                    wrapped = [n for n, m in network.named_modules()
                               if n.endswith("." + target) and hasattr(m, "lora_A")]
                    self.assertTrue(wrapped, f"{family}: {target} not adapted")
                self.train(adapter)
                for name, parameter in network.named_parameters():
                    original = name.replace(".base_layer.", ".")
                    if original in base:
                        self.assertTrue(torch.equal(parameter, base[original]), name)

    def test_unknown_target_names_the_family_modules(self):
        adapter = self.load("sd1x")
        with self.assertRaises(LoraTargetError) as caught:
            add_lora(adapter.trainable, type(adapter), rank=4, target_modules=["to_q", "to_qq"])
        message = str(caught.exception)
        for fragment in ("['to_qq']", "sd1x", "UNet2DConditionModel", "to_q, to_v", "to_out.0"):
            self.assertIn(fragment, message)
        self.assertFalse(any(hasattr(m, "lora_A") for m in adapter.trainable.modules()))


class AdapterWeightsTest(LoraCase):
    def test_save_and_load_round_trip_and_refuse_another_shape(self):
        trained = self.load("sd1x")
        add_lora(trained.trainable, type(trained), rank=4)
        self.train(trained)
        path = self.output / "adapter.safetensors"
        save_adapter_weights(trained.trainable, path)
        fresh = self.load("sd1x")
        add_lora(fresh.trainable, type(fresh), rank=4)
        load_adapter_weights(fresh.trainable, path)
        expected = adapter_state_dict(trained.trainable)
        self.assertEqual(set(expected), set(adapter_state_dict(fresh.trainable)))
        for name, value in adapter_state_dict(fresh.trainable).items():
            self.assertTrue(torch.equal(value, expected[name]), name)
        other = self.load("sd1x")
        add_lora(other.trainable, type(other), rank=4, target_modules=["to_q"])
        with self.assertRaisesRegex(ValueError, "lora_rank or lora_target_modules"):
            load_adapter_weights(other.trainable, path)

    def test_checkpoint_weights_hold_only_the_adapter(self):
        adapter = self.load("sd1x")
        add_lora(adapter.trainable, type(adapter), rank=4)
        self.train(adapter)
        saved = adapter_state_dict(adapter.trainable)
        folder = self.output / "checkpoint"
        folder.mkdir()
        save_weights(adapter.trainable, folder, lora=True)
        self.assertEqual({p.name for p in folder.iterdir()}, {CHECKPOINT_WEIGHTS})
        self.assertEqual(set(load_file(folder / CHECKPOINT_WEIGHTS)), set(saved))
        self.train(adapter)  # move away, then come back
        moved = adapter_state_dict(adapter.trainable)
        self.assertFalse(all(torch.equal(moved[n], saved[n]) for n in saved))
        load_weights(adapter.trainable, folder, lora=True)
        for name, value in adapter_state_dict(adapter.trainable).items():
            self.assertTrue(torch.equal(value, saved[name]), name)


class ExportTest(LoraCase):
    def test_load_lora_weights_puts_the_trained_adapter_on_the_base_pipeline(self):
        for family in ("sd1x", "flux"):
            with self.subTest(family=family):
                adapter = self.load(family)
                # alpha != rank: the scale must travel with the file.
                add_lora(adapter.trainable, type(adapter), rank=4, alpha=8)
                self.train(adapter)
                path = export_lora(type(adapter), adapter.trainable, self.output / family)
                self.assertEqual(path, self.output / family / "lora" /
                                 "pytorch_lora_weights.safetensors")
                self.assertEqual(sorted(p.name for p in path.parent.iterdir()), [path.name])

                def image(pipeline):
                    pipeline.set_progress_bar_config(disable=True)
                    result = pipeline(prompt="a red circle", height=64, width=64,
                                      num_inference_steps=2,
                                      generator=torch.Generator().manual_seed(0))
                    return np.asarray(result.images[0]).astype(np.float64)

                pipeline = DiffusionPipeline.from_pretrained(ensure_builtin_model(f"tiny-{family}"))
                before = image(pipeline)
                pipeline.load_lora_weights(path.parent)
                after = image(pipeline)
                self.assertGreater(np.abs(after - before).mean(), 0.5)
                self.assertLess(np.abs(after - image(adapter.build_pipeline())).max(), 1.0)


if __name__ == "__main__":
    unittest.main()
