"""init_lora: a run's adapter starts from a LoRA file in either lora_format (and a LyCORIS file
for lora_type lycoris) with the file's update, whatever the run's alpha; a file that does not
fit is refused naming what differs; a real run starts from it and exports it unchanged at
learning rate 0."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import torch
from safetensors.torch import load_file

from model_fixtures import TinyModelCase, network_prediction, random_batch, train_adapter
from simpletuner.training.adapters.lora import add_lora, export_lora
from simpletuner.training.adapters.lora_init import LoraInitError, init_adapter
from simpletuner.training.adapters.lycoris_adapter import add_lycoris, write_lycoris
from training_fixtures import make_shapes, run_in_process_logged, write_config

LOKR = {"algo": "lokr", "linear_dim": 10000, "linear_alpha": 1, "factor": 4,
        "apply_preset": {"target_module": ["Attention"]}}


class InitLoraTest(TinyModelCase):
    def setUp(self):
        self.output = Path(self.enterContext(tempfile.TemporaryDirectory()))

    def trained(self, family: str):
        adapter = self.load(family)
        batch = random_batch(adapter, 2, seed=0, prompts=("a", "b"))
        torch.manual_seed(0)
        add_lora(adapter.trainable, type(adapter), rank=4, alpha=8)
        train_adapter(adapter, batch)
        return adapter, batch

    def test_either_format_starts_the_adapter_with_the_files_update(self):
        for family in ("sd1x", "sdxl", "flux", "wan"):
            source, batch = self.trained(family)
            expected = network_prediction(source, batch)
            for lora_format in ("diffusers", "comfyui"):
                with self.subTest(family=family, lora_format=lora_format):
                    path = export_lora(type(source), source.trainable,
                                       self.output / family / lora_format, lora_format)
                    run = self.load(family)
                    add_lora(run.trainable, type(run), rank=4, alpha=2)  # another scale
                    before = network_prediction(run, batch)
                    init_adapter(run, path)
                    trainable = [n for n, p in run.trainable.named_parameters()
                                 if p.requires_grad]
                    self.assertEqual(set(trainable), {
                        n for n, _ in source.trainable.named_parameters() if ".lora_" in n})
                    self.assertFalse([n for n, _ in run.trainable.named_parameters()
                                      if "init_lora" in n])
                    got = network_prediction(run, batch)
                    self.assertGreater((expected - before).abs().max().item(), 1e-5)
                    self.assertLessEqual((got - expected).abs().max().item(), 1e-5)

    def test_a_file_of_another_rank_or_modules_is_refused(self):
        source, _ = self.trained("sd1x")
        path = export_lora(type(source), source.trainable, self.output / "rank", "comfyui")
        for options, fragment in ((dict(rank=8), "this run's lora_rank is 8"),
                                  (dict(rank=4, target_modules=["to_q"]),
                                   "set lora_target_modules")):
            with self.subTest(fragment=fragment):
                run = self.load("sd1x")
                add_lora(run.trainable, type(run), **options)
                with self.assertRaises(LoraInitError) as caught:
                    init_adapter(run, path)
                self.assertIn(fragment, str(caught.exception))
                self.assertIn(str(path), str(caught.exception))

    def test_a_lycoris_run_starts_from_a_lycoris_file(self):
        source = self.load("sd1x")
        batch = random_batch(source, 2, seed=0, prompts=("a", "b"))
        add_lycoris(source.trainable, LOKR, "sd1x")
        train_adapter(source, batch)
        path = write_lycoris(source.trainable, LOKR, "sd1x", self.output / "lokr.safetensors")
        run = self.load("sd1x")
        add_lycoris(run.trainable, LOKR, "sd1x")
        init_adapter(run, path)
        self.assertLessEqual((network_prediction(run, batch) -
                              network_prediction(source, batch)).abs().max().item(), 1e-6)


class InitLoraRunTest(unittest.TestCase):
    """A one-step run at learning rate 0 from a comfyui file exports that adapter."""

    def test_the_run_exports_the_adapter_it_started_from(self):
        root = Path(tempfile.mkdtemp(prefix="st-init-lora-"))
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        make_shapes(root / "data", per_size=2, sizes=((64, 64),))
        lora = dict(model_type="lora", lora_rank=4, lora_alpha=8, max_train_steps=2)
        first = run_in_process_logged(write_config(root, root / "data", "first", **lora,
                                          lora_format="comfyui"), str(root))
        self.assertEqual(first.returncode, 0, first.stderr[-3000:])
        started = root / "first-out" / "lora" / "pytorch_lora_weights.safetensors"
        second = run_in_process_logged(write_config(root, root / "data", "second", **{
            **lora, "learning_rate": 0.0, "max_train_steps": 1, "init_lora": str(started)}),
            str(root))
        self.assertEqual(second.returncode, 0, second.stderr[-3000:])
        exported = load_file(str(root / "second-out" / "lora" /
                                 "pytorch_lora_weights.safetensors"))
        original = load_file(str(started))
        self.assertTrue(any(k.endswith(".lora_up.weight") and original[k].abs().max() > 0
                            for k in original))
        for key, value in exported.items():  # diffusers keys: unet.<path>.lora_A/B.weight
            path = key.removeprefix("unet.")
            kohya = "lora_unet_" + path.rsplit(".lora_", 1)[0].replace(".", "_")
            suffix = ".lora_down.weight" if ".lora_A." in key else ".lora_up.weight"
            self.assertTrue(torch.equal(value, original[kohya + suffix]), key)


if __name__ == "__main__":
    unittest.main()
