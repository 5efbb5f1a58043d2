"""assistant_lora_path (SimpleTuner's assistant adapters for distilled models): a tiny Z-Image
LoRA run with an assistant LoRA (made here with peft on builtin:tiny-z_image) trains with it
applied, and neither its checkpoint nor its exported adapter holds any of its weights; validation
sees it only at assistant_lora_inference_strength; a mistaken option is refused before any
model loads."""

from __future__ import annotations

import os
import unittest
from pathlib import Path
from unittest import mock

import torch
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file

from training_fixtures import (TrainingRuns, environment, make_shapes, read_events,
                               run_in_process, write_config)

from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.assistant import ASSISTANT, assistant_in_validation

FAMILY = "z_image"
ASSISTANT_FILE = "assistant.safetensors"


def load_tiny():
    return get_adapter_class(FAMILY).load(
        ensure_builtin_model(f"tiny-{FAMILY}"), device=torch.device("cpu"),
        weight_dtype=torch.float32, loss_settings=LossSettings())


def make_assistant(folder: Path) -> dict[str, torch.Tensor]:
    """A LoRA on to_q (a module the run's adapter adapts too) and on the feed-forward w1 (one
    it does not), non-zero from the start; written as the pipeline writes LoRA files."""
    adapter = load_tiny()
    network = adapter.trainable
    torch.manual_seed(3)
    network.add_adapter(LoraConfig(r=2, lora_alpha=2, init_lora_weights=False,
                                   target_modules=["to_q", "w1"]))
    weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(network).items()}
    adapter.pipeline_class.save_lora_weights(folder, transformer_lora_layers=weights,
                                             weight_name=ASSISTANT_FILE, safe_serialization=True)
    return weights


class AssistantRunTest(TrainingRuns, unittest.TestCase):
    tmp_prefix = "st-assistant-"
    launch = staticmethod(run_in_process)
    options = dict(model_family=FAMILY, pretrained_model_name_or_path=f"builtin:tiny-{FAMILY}",
                   model_type="lora", lora_rank=2, max_train_steps=2, checkpointing_steps=2,
                   train_batch_size=1)

    @classmethod
    def start_runs(cls):
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.assistant = make_assistant(cls.root / "assistant")
        cls.enterClassContext(mock.patch.dict(os.environ, environment(cls.tmp)))
        cls.train("plain")
        cls.train("assisted", assistant_lora_path=str(cls.root / "assistant"),
                  assistant_lora_weight_name=ASSISTANT_FILE)

    def out(self, name: str) -> Path:
        return self.root / f"{name}-out"

    def test_the_assistant_changed_the_training_loss(self):
        plain, assisted = (read_events(self.out(name), "step")[0]["loss"]
                           for name in ("plain", "assisted"))
        self.assertNotAlmostEqual(plain, assisted, places=5)

    def test_export_and_checkpoint_hold_the_run_adapter_only(self):
        for path in ("lora/pytorch_lora_weights.safetensors",
                     "checkpoint-2/lora_adapter.safetensors"):
            with self.subTest(path=path):
                assisted = load_file(self.out("assisted") / path)
                plain = load_file(self.out("plain") / path)
                self.assertEqual(set(assisted), set(plain))  # the run's own modules, by key
                self.assertFalse([key for key in assisted if ".w1." in key or ASSISTANT in key])
                for key, value in assisted.items():
                    self.assertFalse(any(value.shape == other.shape and torch.equal(value, other)
                                         for other in self.assistant.values()), key)


class AssistantValidationTest(unittest.TestCase):
    def test_validation_uses_the_inference_strength_then_training_resumes_with_it(self):
        import tempfile
        from simpletuner.training.adapters.assistant import add_assistant
        from simpletuner.training.adapters.lora import add_lora

        with tempfile.TemporaryDirectory() as folder:
            make_assistant(Path(folder))
            adapter = load_tiny()
            network = adapter.trainable
            add_lora(network, type(adapter), rank=2)
            training = mock.Mock(assistant_lora_path=folder, assistant_lora_weight_name=None,
                                 assistant_lora_strength=0.5,
                                 assistant_lora_inference_strength=0.0)
            add_assistant(adapter, training)
        layer = network.get_submodule("layers.0.attention.to_q")
        self.assertEqual((layer.active_adapters, layer.scaling[ASSISTANT]),
                         (["default", ASSISTANT], 0.5))
        with assistant_in_validation(network, training):
            self.assertEqual(layer.active_adapters, ["default"])
        self.assertEqual(layer.active_adapters, ["default", ASSISTANT])
        trainable = {name for name, p in network.named_parameters() if p.requires_grad}
        self.assertTrue(trainable)
        self.assertFalse([name for name in trainable if ".default." not in name])


class AssistantOptionsTest(unittest.TestCase):
    def problems(self, root: Path, **options) -> str:
        from simpletuner.configuration import ConfigError, load_configuration
        from simpletuner.training.preflight import run_preflight

        config = write_config(root, root / "data", "check", **options)
        with self.assertRaises(ConfigError) as caught:
            run_preflight(load_configuration(config))
        return str(caught.exception)

    def test_a_full_run_or_an_absent_file_is_refused(self):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=2, sizes=((64, 64),))
            absent = str(root / "absent.safetensors")
            with mock.patch.dict(os.environ, environment(tmp)):
                message = self.problems(root, assistant_lora_path=absent)
                self.assertIn("key 'assistant_lora_path' is set but model_type is 'full'",
                              message)
                message = self.problems(root, model_type="lora", assistant_lora_path=absent)
                self.assertIn("absent.safetensors does not exist", message)
                message = self.problems(root, model_type="lora", assistant_lora_path=tmp)
                self.assertIn("without exactly one .safetensors file", message)

    def test_a_flavour_simpletuner_assists_by_default_is_warned_about_without_one(self):
        import tempfile

        from simpletuner.configuration import load_configuration
        from simpletuner.training.run.launch_checks import launch_warnings

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_shapes(root / "data", per_size=2, sizes=((64, 64),))
            turbo = dict(model_family=FAMILY, pretrained_model_name_or_path=f"builtin:tiny-{FAMILY}",
                         model_type="lora", model_flavour="turbo")
            warned = [warning for options in ({}, {"disable_assistant_lora": True},
                                              {"model_flavour": "base"})
                      for warning in launch_warnings(load_configuration(write_config(
                          root, root / "data", "check", **{**turbo, **options})))
                      if "assistant" in warning]
        self.assertEqual(len(warned), 1, warned)
        self.assertIn("ostris/zimage_turbo_training_adapter", warned[0])
        self.assertIn("set assistant_lora_path", warned[0])


if __name__ == "__main__":
    unittest.main()
