"""Masked loss (a ``conditioning_type: mask`` dataset named by conditioning_data): in-process
runs of builtin:tiny-sd1x on targets whose right part is masked out, randomly cropped (the
mask must follow its target's crop). Noise there leaves the trained weights bit-equal to the
run where that part is a flat colour; without the mask the two differ. The orphans of either
side are skipped and reported. The weighting itself: objective_loss against a hand count."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.loss_types import objective_loss
from training_fixtures import TrainingRuns, run_in_process, write_config

SIZE, KEPT = (96, 64), 48  # the left 48 columns are trained; crops are 64 wide
UNET = Path("pipeline") / "unet" / "diffusion_pytorch_model.safetensors"


def make_masked(root: Path, right: str, count: int = 6) -> tuple[Path, Path]:
    """targets/<name>.png (a gradient on the left, ``right`` ('noise' or 'flat') on the right)
    with captions, masks/<name>.png (white left, black right); one orphan on each side."""
    targets, masks = root / f"targets-{right}", root / "masks"
    targets.mkdir()
    masks.mkdir(exist_ok=True)
    rng = np.random.default_rng(11)
    w, h = SIZE
    for i in range(count + 1):
        pixels = np.zeros((h, w, 3), np.uint8)
        pixels[:, :KEPT] = (np.arange(KEPT)[None, :, None] * (4 + i)) % 256
        pixels[:, KEPT:] = (rng.integers(0, 256, (h, w - KEPT, 3)) if right == "noise"
                            else (40, 80, 220))
        name = f"img-{i:02d}" if i < count else "no-mask"
        Image.fromarray(pixels).save(targets / f"{name}.png")
        (targets / f"{name}.txt").write_text(f"a gradient number {i}")
    mask = np.zeros((h, w, 3), np.uint8)
    mask[:, :KEPT] = 255
    for name in [f"img-{i:02d}" for i in range(count)] + ["no-target"]:
        Image.fromarray(mask).save(masks / f"{name}.png")
    return targets, masks


def masked_datasets(targets: Path, masks: Path | None) -> list[dict]:
    target = {"id": "targets", "instance_data_dir": str(targets), "caption_strategy": "textfile",
              "crop": True, "crop_style": "random", "crop_aspect": "square"}
    if masks is None:
        return [target]
    return [{**target, "conditioning_data": "masks"},
            {"id": "masks", "dataset_type": "conditioning", "conditioning_type": "mask",
             "instance_data_dir": str(masks)}]


class MaskedLossRunsTest(TrainingRuns, unittest.TestCase):
    tmp_prefix = "st-masked-"
    launch = staticmethod(run_in_process)
    options = {"max_train_steps": 3, "learning_rate": 1e-2}

    @classmethod
    def start_runs(cls):
        noise, masks = make_masked(cls.root, "noise")
        flat, _ = make_masked(cls.root, "flat")
        cls.results = {
            "noise": cls.train("noise", datasets=masked_datasets(noise, masks)),
            "flat": cls.train("flat", datasets=masked_datasets(flat, masks)),
            "noise-unmasked": cls.train("noise-unmasked", datasets=masked_datasets(noise, None)),
            "flat-unmasked": cls.train("flat-unmasked", datasets=masked_datasets(flat, None)),
        }

    def weights(self, run: str) -> dict[str, torch.Tensor]:
        return load_file(str(self.root / f"{run}-out" / UNET))

    def test_what_is_masked_out_has_no_effect_on_the_trained_weights(self):
        noise, flat = self.weights("noise"), self.weights("flat")
        self.assertEqual(noise.keys(), flat.keys())
        for name in noise:
            self.assertTrue(torch.equal(noise[name], flat[name]), name)

    def test_without_the_mask_the_masked_out_part_changes_the_weights(self):
        noise, flat = self.weights("noise-unmasked"), self.weights("flat-unmasked")
        self.assertTrue(any(not torch.equal(noise[n], flat[n]) for n in noise))

    def test_the_orphans_of_both_sides_are_skipped_and_reported(self):
        skipped = json.loads((self.root / "noise-out" / "skipped_files.json").read_text())
        text = json.dumps(skipped)
        self.assertIn("no-mask.png", text)
        self.assertIn("no-target.png", text)


class MaskConfigTest(unittest.TestCase):
    def load(self, datasets, **options):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            targets, masks = make_masked(root, "flat", count=1)
            config = write_config(root, targets, datasets=datasets(targets, masks), **options)
            return load_configuration(config, cwd=root)

    def test_any_model_trains_with_a_mask_dataset_as_simpletuner_writes_it(self):
        def datasets(targets, masks):  # conditioning_type alone makes it a conditioning dataset
            target, mask = masked_datasets(targets, masks)
            return [target, {key: value for key, value in mask.items() if key != "dataset_type"}]

        configuration = self.load(datasets)  # model_family sd1x: no reference images
        self.assertEqual([ds.id for ds in configuration.references], ["masks"])
        self.assertTrue(configuration.references[0].is_mask)

    def test_a_mask_named_with_reference_images_is_refused_with_what_to_do(self):
        def datasets(targets, masks):
            target, mask = masked_datasets(targets, masks)
            return [{**target, "conditioning_data": ["masks", "refs"]}, mask,
                    {"id": "refs", "dataset_type": "conditioning",
                     "conditioning_type": "reference_strict", "instance_data_dir": str(masks)}]

        with self.assertRaises(ConfigError) as caught:
            self.load(datasets, model_family="flux", model_flavour="kontext")
        text = json.dumps(caught.exception.problems)
        self.assertIn("names the mask dataset 'masks' with other conditioning datasets", text)
        self.assertIn("which is not supported: name it alone", text)


class MaskWeightingTest(unittest.TestCase):
    def test_the_loss_counts_each_position_by_its_mask(self):
        prediction = torch.zeros(2, 4, 2, 2)
        target = torch.arange(32, dtype=torch.float32).view(2, 4, 2, 2)
        mask = torch.tensor([[[[1.0, 0.0], [0.5, 0.0]]], [[[0.0, 0.0], [0.0, 1.0]]]])
        loss = objective_loss(prediction, target, loss_type="l2", mask=mask)
        first = sum(float(target[0, c, 0, 0]) ** 2 + 0.5 * float(target[0, c, 1, 0]) ** 2
                    for c in range(4)) / 16
        second = sum(float(target[1, c, 1, 1]) ** 2 for c in range(4)) / 16
        self.assertAlmostEqual(loss.item(), (first + second) / 2, places=3)


if __name__ == "__main__":
    unittest.main()
