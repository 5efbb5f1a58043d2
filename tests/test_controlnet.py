"""ControlNet training (controlnet: true), in process: a run of a family's tiny model on shapes
whose control images (each circle's outline, conditioning_type 'controlnet') are matched by
stem trains the ControlNet (initialised from the base network) and leaves the base network as
it was; resumed from checkpoint-2 it ends with bit-equal weights, and a run given its export
(controlnet_model_name_or_path) starts from it; validation writes each
control image beside its result; the export is the family's ControlNet pipeline, whose
controlnet/ loads as the family's ControlNet class and whose output follows the control image.
Configuration: what controlnet needs of the family, model_type and datasets. SimpleTuner's
conditioning block: Canny edges of each target, generated and cached for the ControlNet."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import (ControlNetModel, DiffusionPipeline, FluxControlNetModel,
                       FluxControlNetPipeline, StableDiffusionXLControlNetPipeline)
from PIL import Image, ImageFilter
from safetensors.torch import load_file

from conformance import Case, ResumedRuns, make_dataset, network_weights
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.caching.generators import canny
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.training.run.dataset_folders import shared_folder_warnings
from training_fixtures import make_shapes, run_in_process, write_config

# A ControlNet's zero convolutions (and its control embedding's last one) start at 0, so the
# control image's effect grows as the product of two of them: a high rate shows it in 4 steps.
CONTROLNET = dict(controlnet=True, learning_rate=3e-2, eval_dataset_id="shapes",
                  num_eval_images=1, validation_num_inference_steps=1, validation_resolution=64)


def write_controls(data: Path, controls: Path) -> None:
    """controls/<stem>.jpg: the outline of each image's circle, white on black."""
    controls.mkdir()
    for image in sorted(data.glob("*.png")):
        with Image.open(image) as source:
            edges = source.convert("L").filter(ImageFilter.FIND_EDGES)
        edges.point(lambda v: 255 if v > 8 else 0).convert("RGB").save(
            controls / f"{image.stem}.jpg", quality=95)


def control_datasets(data: Path, datasets: list[dict], controls: Path) -> list[dict]:
    return [{**datasets[0], "conditioning_data": "controls"},
            {"id": "controls", "dataset_type": "conditioning", "conditioning_type": "controlnet",
             "instance_data_dir": str(controls)}]


class ControlNetRuns(ResumedRuns):
    """Mixed into a TestCase: the ``case``'s ControlNet run, resumed; ``pipeline_class`` and
    ``controlnet_class`` are what its export loads as; ``base`` the base network's folder."""

    pipeline_class: type
    controlnet_class: type
    base: str

    @classmethod
    def make_dataset(cls):
        data, datasets = make_dataset(cls.case, cls.root)
        write_controls(data, cls.root / "controls")
        return data, control_datasets(data, datasets, cls.root / "controls")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.full = cls.run_and_resume("full", **CONTROLNET)
        exported = cls.full.out / "pipeline" / "controlnet"
        started = cls.trainer("started", controlnet_model_name_or_path=str(exported),
                              **CONTROLNET)
        cls.started = network_weights(started)
        del started

    def test_the_controlnet_trains_and_its_resumed_twin_ends_with_the_same_weights(self):
        self.assert_trained_and_resumed_exactly(self.full)

    def test_the_export_holds_the_trained_controlnet_and_the_base_network_unchanged(self):
        folder = self.full.out / "pipeline"
        index = json.loads((folder / "model_index.json").read_text())
        self.assertEqual(index["_class_name"], self.pipeline_class.__name__)
        controlnet = self.controlnet_class.from_pretrained(folder / "controlnet")
        exported = controlnet.state_dict()
        self.assertEqual(set(exported), set(self.full.end))
        for name, tensor in self.full.end.items():
            self.assertTrue(torch.equal(exported[name], tensor), name)
        model = ensure_builtin_model(self.case.model)
        (weights,) = (model / self.base).glob("*.safetensors")
        base, trained = load_file(str(weights)), load_file(
            str(folder / self.base / weights.name))
        for name, tensor in base.items():
            self.assertTrue(torch.equal(trained[name], tensor), name)

    def test_a_run_from_controlnet_model_name_or_path_starts_from_that_controlnet(self):
        self.assertEqual(set(self.started), set(self.full.end))
        for name, tensor in self.full.end.items():
            self.assertTrue(torch.equal(self.started[name], tensor), name)

    def test_the_exported_pipeline_follows_the_control_image(self):
        pipeline = DiffusionPipeline.from_pretrained(self.full.out / "pipeline")
        self.assertIsInstance(pipeline, self.pipeline_class)
        with Image.open(sorted((self.root / "controls").glob("*.jpg"))[0]) as control:
            outline = control.convert("RGB")

        def generate(control: Image.Image) -> np.ndarray:
            image = pipeline(prompt="a red circle", generator=torch.Generator().manual_seed(0),
                             width=64, height=64, num_inference_steps=2, output_type="np",
                             **{self.image_argument: control})
            return np.asarray(image.images[0], dtype=np.float64)

        blank = Image.new("RGB", outline.size)
        self.assertGreater(np.abs(generate(outline) - generate(blank)).mean(), 1e-3)

    def test_validation_puts_each_control_image_beside_its_result(self):
        folder = self.full.out / "validation" / "step-4"
        with Image.open(folder / "edit-00.png") as shown, \
                Image.open(folder / "image-00.png") as result:
            self.assertEqual(shown.size, (2 * result.width, result.height))
            left = np.asarray(shown.convert("RGB"))[:, :result.width]
        first = sorted((self.root / "controls").glob("*.jpg"))[0]
        with Image.open(first) as control:
            expected = np.asarray(control.convert("RGB").resize(result.size))
        self.assertLess(np.abs(left.astype(int) - expected.astype(int)).mean(), 8)


class SDXLControlNetTest(ControlNetRuns, unittest.TestCase):
    case = Case("sdxl", None, "tiny-sdxl", "image")
    pipeline_class = StableDiffusionXLControlNetPipeline
    controlnet_class = ControlNetModel
    base, image_argument = "unet", "image"


class FluxControlNetTest(ControlNetRuns, unittest.TestCase):
    case = Case("flux", None, "tiny-flux", "image")
    pipeline_class = FluxControlNetPipeline
    controlnet_class = FluxControlNetModel
    base, image_argument = "transformer", "control_image"


class ControlNetConfigTest(unittest.TestCase):
    def problems(self, datasets=None, **options) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            data, plain = make_dataset(Case("sdxl", None, "tiny-sdxl", "image"), root)
            write_controls(data, root / "controls")
            listed = (control_datasets(data, plain, root / "controls") if datasets is None
                      else datasets(data, plain, root / "controls"))
            config = write_config(root, data, datasets=listed, **{
                "model_family": "sdxl", "pretrained_model_name_or_path": "builtin:tiny-sdxl",
                **options})
            with self.assertRaises(ConfigError) as caught:
                load_configuration(config, cwd=root)
        return json.dumps(caught.exception.problems)

    def test_a_family_without_controlnet_training_lora_and_block_swap_are_refused(self):
        text = self.problems(controlnet=True, model_family="sd1x",
                             pretrained_model_name_or_path="builtin:tiny-sd1x")
        self.assertIn("'controlnet' is not supported here for model_family 'sd1x'; ControlNets "
                      "train for model_family 'flux' and 'sdxl'", text)
        self.assertIn("with model_type 'lora' (ControlNet-LoRA); set model_type 'full'",
                      self.problems(controlnet=True, model_type="lora"))
        self.assertIn("a controlnet run trains the ControlNet beside the frozen network",
                      self.problems(controlnet=True, musubi_blocks_to_swap=1))

    def test_control_images_and_controlnet_need_each_other(self):
        self.assertIn("hold ControlNet control images (conditioning_type 'controlnet'); set "
                      "controlnet: true", self.problems())
        text = self.problems(lambda data, plain, controls: plain, controlnet=True,
                             controlnet_model_name_or_path=None)
        self.assertIn("controlnet: true trains on control images: name the conditioning "
                      "dataset", text)
        self.assertIn("key 'controlnet_model_name_or_path' is the ControlNet a controlnet run "
                      "starts from; set controlnet: true", self.problems(
                          lambda data, plain, controls: plain, controlnet_model_name_or_path="x"))
        self.assertIn("'x', which is not a diffusers ControlNet folder", self.problems(
            controlnet=True, controlnet_model_name_or_path="x"))

    def test_validation_takes_the_control_images_of_eval_dataset_id(self):
        text = self.problems(controlnet=True, validation_prompt="a red circle")
        self.assertIn("a ControlNet pipeline generates from a control image and cannot "
                      "generate from a prompt alone; set eval_dataset_id", text)




class GeneratedCannyTest(unittest.TestCase):
    """SimpleTuner's conditioning block: Canny edges of each target, generated while caching."""

    def test_canny_finds_a_squares_outline_and_nothing_else(self):
        image = np.zeros((32, 32, 3), np.uint8)
        image[8:24, 8:24] = 255
        edges = canny(image, 100, 200)
        ys, xs = np.nonzero(edges)
        ring = np.maximum(np.abs(ys - 15.5), np.abs(xs - 15.5))  # 7.5: the square's border
        self.assertTrue(np.all(np.abs(ring - 8) <= 1.0), sorted(set(ring)))
        for side in (ys < 12, ys > 20, xs < 12, xs > 20):
            self.assertGreaterEqual(int(side.sum()), 14)
        self.assertFalse(canny(np.full((32, 32, 3), 90, np.uint8), 100, 200).any())

    def test_a_controlnet_run_trains_on_the_edges_of_its_own_images(self):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            data = root / "data"
            make_shapes(data, per_size=2, sizes=((64, 64),))
            datasets = [{"id": "shapes", "instance_data_dir": str(data),
                         "caption_strategy": "textfile",
                         "conditioning": [{"type": "canny", "low_threshold": 50,
                                           "high_threshold": 100, "captions": ["ignored"]}]}]
            config = write_config(root, data, datasets=datasets, controlnet=True,
                                  model_family="sdxl", max_train_steps=1,
                                  pretrained_model_name_or_path="builtin:tiny-sdxl")
            configuration = load_configuration(config, cwd=root)
            self.assertEqual(configuration.datasets[0].conditioning_ids(),
                             ["shapes_conditioning_canny"])
            self.assertEqual(shared_folder_warnings(configuration), [])  # no second read
            self.assertEqual(run_in_process(config).steps, 1)
            folder = root / "config-out" / "cache" / "vae" / "shapes_conditioning_canny"
            entries = [load_file(str(p))["latent"] for p in folder.rglob("*.safetensors")]
        self.assertEqual(len(entries), 2)
        for entry in entries:  # SDXL keeps control pixels in [0, 1]: white edges on black
            self.assertEqual(set(entry.unique().tolist()), {0.0, 1.0})
            ys, xs = np.nonzero(entry[0].numpy())
            radius = np.hypot(ys - 31.5, xs - 31.5)  # the circle: 16 around the centre
            self.assertTrue(np.all(np.abs(radius - 16) <= 2.0), sorted(set(radius.round(1))))
            self.assertGreater(len(ys), 80)  # most of its 100-pixel circumference


if __name__ == "__main__":
    unittest.main()
