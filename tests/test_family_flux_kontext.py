"""FLUX.1 Kontext (model_family flux, model_flavour kontext): the transformer gets each
reference as FluxKontextPipeline gives it (packed latents appended, position ids (1, row,
column)), and the reference changes the prediction; runs of builtin:tiny-flux-kontext on edit
pairs train each target with its own reference, leave orphans out, evaluate held-out pairs with
their references, and export a FluxKontextPipeline whose edit depends on its reference image.
Training, resume and export in general: the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import json
import unittest
from dataclasses import replace

import numpy as np
import torch
from PIL import Image
from diffusers import DiffusionPipeline, FluxKontextPipeline
from safetensors.torch import load_file

from edit_fixtures import circle, edit_datasets, make_edit_pairs
from model_fixtures import CPU, network_prediction, random_batch
from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from trained_outputs import TrainedOutputAssertions
from training_fixtures import TrainingRuns, read_events, read_jsonl, run_in_process

KONTEXT = dict(model_family="flux", model_flavour="kontext",
               pretrained_model_name_or_path="builtin:tiny-flux-kontext")


def load_kontext():
    return get_adapter_class("flux").load(ensure_builtin_model("tiny-flux-kontext"), device=CPU,
                                          weight_dtype=torch.float32,
                                          loss_settings=LossSettings())


class KontextAdapterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.adapter = load_kontext()
        pixels = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3)) * 2 - 1
        cls.reference_pixels = pixels
        cls.batch = replace(random_batch(cls.adapter, 2),
                            reference_latents=(cls.adapter.encode_images(pixels),))

    def test_the_network_gets_the_reference_as_flux_kontext_pipeline_gives_it(self):
        seen = {}

        def zero_network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        loss = self.adapter.compute_loss(self.batch, torch.Generator().manual_seed(5),
                                         network=zero_network)
        pipeline = self.adapter.build_pipeline()
        self.assertIsInstance(pipeline, FluxKontextPipeline)
        _, image_latents, latent_ids, image_ids = pipeline.prepare_latents(
            self.reference_pixels, 2, 16, 64, 64, torch.float32, CPU,
            torch.Generator().manual_seed(0))
        tokens = (64 // 16) ** 2  # 8x VAE, 2x2 packing
        self.assertEqual(seen["hidden_states"].shape[1], 2 * tokens)
        torch.testing.assert_close(seen["hidden_states"][:, tokens:], image_latents)
        self.assertTrue(torch.equal(seen["img_ids"], torch.cat([latent_ids, image_ids])))
        self.assertTrue(bool((seen["img_ids"][tokens:, 0] == 1).all()))
        # the loss covers the noisy image's tokens only: zero prediction = mean square target
        noisy = seen["hidden_states"][:, :tokens]
        sigma = seen["timestep"].view(-1, 1, 1)
        packed = pipeline._pack_latents(self.batch.latents, 2, 16, 8, 8)
        noise = (noisy - (1 - sigma) * packed) / sigma
        self.assertAlmostEqual(loss.item(), (noise - packed).pow(2).mean().item(), places=4)

    def test_the_reference_changes_the_prediction_of_the_image(self):
        tokens = 16
        other = replace(self.batch, reference_latents=(torch.flip(
            self.batch.reference_latents[0], dims=[0]),))
        first = network_prediction(self.adapter, self.batch)[:, :tokens]
        second = network_prediction(self.adapter, other)[:, :tokens]
        self.assertGreater((first - second).abs().mean().item(), 1e-4)

    def test_a_flux_folder_is_refused_for_the_kontext_flavour_and_back(self):
        flux = get_adapter_class("flux")
        problem = flux.flavour_problem(ensure_builtin_model("tiny-flux"), "kontext")
        self.assertIn("FluxKontextPipeline", problem)
        self.assertIn("builtin:tiny-flux-kontext", problem)
        self.assertIn("model_flavour 'kontext'",
                      flux.flavour_problem(ensure_builtin_model("tiny-flux-kontext"), None))
        self.assertIsNone(flux.flavour_problem(ensure_builtin_model("tiny-flux"), None))


class KontextTrainingTest(TrainingRuns, TrainedOutputAssertions, unittest.TestCase):
    """In this process, on 4 edit pairs plus an orphan on each side: a full run of 4 steps,
    validated, and a 2-step run with reference_loose references of another size."""

    tmp_prefix = "st-kontext-"
    launch = staticmethod(run_in_process)
    options = dict(KONTEXT, max_train_steps=4, train_batch_size=2,
                   trace_samples=True, validation_prompt="make the circle red",
                   validation_num_inference_steps=2, validation_resolution=64)

    @classmethod
    def start_runs(cls):
        root = cls.root
        cls.targets, cls.references, _ = make_edit_pairs(root, count=4)
        circle("red", "blue", (64, 64)).save(cls.targets / "lonely-target.png")
        (cls.targets / "lonely-target.txt").write_text("make the circle red")
        circle("red", "blue", (64, 64)).save(cls.references / "lonely-reference.jpg")
        cls.datasets = edit_datasets(cls.targets, cls.references)
        cls.train("full")
        cls.loose_references = root / "loose-references"  # wider than their targets
        cls.loose_references.mkdir()
        for target in cls.targets.glob("??x??-*.png"):
            circle("green", "blue", (96, 64)).save(cls.loose_references / f"{target.stem}.jpg")
        edits, loose = edit_datasets(cls.targets, cls.loose_references)
        held_out = [{**entry, "id": f"held-out-{entry['id']}"}
                    for entry in edit_datasets(cls.targets, cls.references)]
        held_out[0].update(dataset_type="eval", conditioning_data=held_out[1]["id"])
        cls.train("loose",
                  datasets=[edits, {**loose, "conditioning_type": "reference_loose"}, *held_out],
                  max_train_steps=2, train_batch_size=1, eval_steps_interval=1,
                  validation_prompt=None)

    def test_each_target_trains_with_its_own_reference_and_orphans_are_reported(self):
        out = self.root / "full-out"
        pairs = [(s, refs) for record in read_jsonl(out / "trace" / "rank-0.jsonl")
                 for s, refs in zip(record["samples"], record["references"])]
        self.assertEqual(len(pairs), 8)  # 4 steps of 2
        for sample_id, refs in pairs:
            self.assertEqual(refs, [sample_id.replace(".png", ".jpg")])
        self.assertNotIn("lonely-target.png", {s for s, _ in pairs})
        skipped = json.loads((out / "skipped_files.json").read_text())
        self.assertEqual([e["path"] for e in skipped["edits"]], ["lonely-target.png"])
        self.assertEqual([e["path"] for e in skipped["edit-references"]],
                         ["lonely-reference.jpg"])
        self.assertIn("no usable reference named 'lonely-target'", skipped["edits"][0]["reason"])

    def test_loose_references_train_in_their_own_bucket(self):
        out = self.root / "loose-out"
        cached = sorted((out / "cache" / "vae" / "edit-references").rglob("*.safetensors"))
        self.assertEqual(len(cached), 4)  # one per paired target
        for path in cached:  # 96x64 pixels: 12 x 8 latent pixels, not the target's 8 x 8
            self.assertEqual(tuple(load_file(str(path))["latent"].shape), (16, 8, 12))
        for record in read_jsonl(out / "trace" / "rank-0.jsonl"):
            self.assertEqual(record["references"],
                             [[s.replace(".png", ".jpg")] for s in record["samples"]])

    def test_an_eval_dataset_of_pairs_is_evaluated_with_its_references(self):
        out = self.root / "loose-out"
        held_out = sorted((out / "cache" / "vae" / "held-out-edit-references").rglob(
            "*.safetensors"))
        self.assertEqual(len(held_out), 4)  # strict: the targets' 8 x 8
        self.assertEqual(tuple(load_file(str(held_out[0]))["latent"].shape), (16, 8, 8))
        losses = read_events(out, "eval")
        self.assertEqual([line["step"] for line in losses], [1, 2])
        skipped = json.loads((out / "skipped_files.json").read_text())
        self.assertEqual([e["path"] for e in skipped["held-out-edits"]], ["lonely-target.png"])

    def test_the_export_is_a_kontext_pipeline_that_edits_a_reference_image(self):
        out = self.root / "full-out"
        with Image.open(out / "validation" / "step-4" / "grid.png") as grid:
            self.assertEqual(grid.size, (64, 64))  # the validation size, not Kontext's 1024
        pipeline = DiffusionPipeline.from_pretrained(out / "pipeline")
        self.assertIsInstance(pipeline, FluxKontextPipeline)
        red = self.edit(pipeline, circle("red", "blue", (64, 64)))
        green = self.edit(pipeline, circle("green", "yellow", (64, 64)))
        self.assertEqual(red.shape, (64, 64, 3))
        self.assertGreater(np.abs(red - green).mean(), 0.0)  # the edit depends on its reference

    def edit(self, pipeline, reference) -> np.ndarray:
        return self.sample_image(pipeline, 64, 64, image=reference, _auto_resize=False,
                                 max_area=64 * 64)


if __name__ == "__main__":
    unittest.main()
