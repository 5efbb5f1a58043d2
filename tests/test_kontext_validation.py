"""Validation of an edit model with its references (eval_dataset_id, SimpleTuner's key): a Kontext
LoRA on an int8-torchao base, trained on edit pairs (`python -m simpletuner.train`: the
launchers are tested in their own tests), edits the first num_eval_images references with their
targets' captions at every validation; the result and reference | result land in
validation/step-N/ and the report's grid; the run resumes exactly, validation included.
eval_dataset_id's problems are all reported before launch."""

from __future__ import annotations

import shutil
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from edit_fixtures import circle, edit_datasets, make_edit_pairs
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.data_backend.local import LocalStorage
from simpletuner.helpers.multiaspect.captions import CaptionPolicy
from simpletuner.models.base import LossSettings
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.reporting.report_data import read_report_data
from simpletuner.training.reporting.validation_edits import EditPairs, run_edit_validation
from simpletuner.training.settings import ValidationSettings
from trained_outputs import LORA_WEIGHTS, TrainedOutputAssertions
from training_fixtures import copy_checkpoint, run_in_process_logged, write_config

EDIT_VALIDATION = dict(
    model_family="flux", model_flavour="kontext", model_type="lora", lora_rank=4,
    pretrained_model_name_or_path="builtin:tiny-flux-kontext", learning_rate=1e-2,
    base_model_precision="int8-torchao", max_train_steps=4, checkpointing_steps=2,
    train_batch_size=2, eval_dataset_id="edits", num_eval_images=2, validation_steps=2,
    validation_num_inference_steps=2, validation_resolution=64)
VALIDATED = ["64x64-00", "64x64-01"]  # the first two targets by sample id


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


class KontextEditValidationTest(TrainedOutputAssertions, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="st-kontext-validation-")
        cls.root = root = Path(cls.tmp)
        cls.targets, cls.references, _ = make_edit_pairs(root, count=4)
        cls.whole = cls.train("run")
        if copy_checkpoint(root, "run", "resumed"):
            cls.resumed = cls.train("resumed", resume_from_checkpoint="latest")

    @classmethod
    def train(cls, name: str, **options):
        config = write_config(cls.root, cls.targets, name,
                              datasets=edit_datasets(cls.targets, cls.references),
                              **EDIT_VALIDATION, **options)
        return run_in_process_logged(config, cls.tmp)  # what a run does, in this process

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def step_folder(self, run: str, step: int) -> Path:
        return self.root / f"{run}-out" / "validation" / f"step-{step}"

    def test_each_validation_edits_the_references_with_their_captions(self):
        self.assertEqual(self.whole.returncode, 0, self.whole.stderr[-3000:])
        self.assertIn("quantized to int8-torchao", self.whole.stderr)
        for step in (2, 4):
            folder = self.step_folder("run", step)
            for index, name in enumerate(VALIDATED):
                with self.subTest(step=step, pair=name):
                    edit = folder / f"edit-{index:02d}.png"
                    result = folder / f"image-{index:02d}.png"
                    caption = (self.targets / f"{name}.txt").read_text()
                    for path in (edit, result):
                        with Image.open(path) as image:
                            self.assertEqual(image.info["prompt"], caption)
                    side_by_side = pixels(edit)
                    self.assertEqual(side_by_side.shape, (64, 128, 3))
                    reference = pixels(self.references / f"{name}.jpg")
                    self.assertTrue(np.array_equal(side_by_side[:, :64], reference))
                    self.assertTrue(np.array_equal(side_by_side[:, 64:], pixels(result)))
            self.assertFalse((folder / "image-02.png").exists())  # num_eval_images 2
        # the LoRA trained between the validations: the same edit changed
        self.assertFalse(np.array_equal(pixels(self.step_folder("run", 2) / "image-00.png"),
                                        pixels(self.step_folder("run", 4) / "image-00.png")))

    def test_the_report_grid_shows_reference_and_result_with_the_prompt(self):
        self.assertEqual(self.whole.returncode, 0, self.whole.stderr[-3000:])
        out = self.root / "run-out"
        shown = read_report_data(out, verify_hashes=False).validation[4]
        self.assertEqual([image.path for image in shown],
                         ["validation/step-4/edit-00.png", "validation/step-4/edit-01.png"])
        self.assertEqual(shown[1].prompt, (self.targets / "64x64-01.txt").read_text())
        self.assertEqual(shown[0].size, (64, 64))  # the result's size, as validated
        self.assertIn('src="validation/step-4/edit-00.png"',
                      (out / "training_report.html").read_text(encoding="utf-8"))

    def test_the_resumed_run_ends_with_the_same_adapter_and_the_same_edits(self):
        self.assertEqual(self.resumed.returncode, 0, self.resumed.stderr[-3000:])
        self.assertIn("resumed from", self.resumed.stderr)
        self.assert_same_tensors(self.root / "run-out" / LORA_WEIGHTS,
                                 self.root / "resumed-out" / LORA_WEIGHTS)
        for index in range(len(VALIDATED)):
            self.assertTrue(np.array_equal(
                pixels(self.step_folder("run", 4) / f"edit-{index:02d}.png"),
                pixels(self.step_folder("resumed", 4) / f"edit-{index:02d}.png")))


class EditValidationPipelineTest(unittest.TestCase):
    """In one process, on the unquantized tiny Kontext: each validation result is what
    FluxKontextPipeline makes of that reference and caption at validation_seed."""

    def test_each_result_is_the_kontext_pipelines_edit_of_its_reference(self):
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        (root / "refs").mkdir()
        references = {"red.png": circle("red", "blue", (64, 64)),
                      "green.png": circle("green", "yellow", (64, 64))}
        for name, image in references.items():
            image.save(root / "refs" / name)
        config = write_config(root, root / "refs", datasets=edit_datasets(root, root / "refs"),
                              **{**EDIT_VALIDATION, "base_model_precision": "no_change"})
        settings = ValidationSettings.from_config(load_configuration(config).training)
        adapter = get_adapter_class("flux").load(
            ensure_builtin_model("tiny-flux-kontext"), device=torch.device("cpu"),
            weight_dtype=torch.float32, loss_settings=LossSettings())
        pairs = EditPairs(["a.png", "b.png"], {"a.png": "red.png", "b.png": "green.png"},
                          LocalStorage(root / "refs"), lambda target: "make the circle blue",
                          CaptionPolicy())
        run_edit_validation(adapter, settings, pairs, step=1)
        results = [pixels(root / "config-out" / "validation" / "step-1" / f"image-{i:02d}.png")
                   for i in range(2)]
        pipeline = adapter.build_pipeline()
        for result, reference in zip(results, references.values()):
            expected = pipeline(prompt="make the circle blue", image=reference, height=64,
                                width=64, num_inference_steps=2, _auto_resize=False,
                                max_area=64 * 64, guidance_scale=settings.validation_guidance_scale,
                                generator=torch.Generator().manual_seed(0)).images[0]
            self.assertTrue(np.array_equal(result, np.asarray(expected)))
        self.assertFalse(np.array_equal(*results))  # same prompt, the reference decides


class EditValidationConfigTest(unittest.TestCase):
    def setUp(self):
        self.root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        self.targets, self.references, _ = make_edit_pairs(self.root, count=1)

    def problems(self, datasets: list[dict], **options) -> str:
        config = write_config(self.root, self.targets, datasets=datasets,
                              **{**EDIT_VALIDATION, **options})
        with self.assertRaises(ConfigError) as raised:
            load_configuration(config)
        return str(raised.exception)

    def test_every_problem_of_eval_dataset_id_is_reported_at_once(self):
        datasets = edit_datasets(self.targets, self.references)
        plain = {"id": "plain", "instance_data_dir": str(self.targets),
                 "caption_strategy": "textfile"}
        message = self.problems([*datasets, plain], eval_dataset_id="plain",
                                validation_prompt="make the circle red")
        self.assertIn("key 'eval_dataset_id' names 'plain', which has no conditioning_data",
                      message)
        self.assertIn("remove validation_prompt and user_prompt_library", message)
        self.assertIn("names 'missing', which is not an enabled dataset",
                      self.problems(datasets, eval_dataset_id="missing"))

    def test_a_model_without_references_is_told_to_remove_it(self):
        message = self.problems([{"id": "plain", "instance_data_dir": str(self.targets),
                                  "caption_strategy": "textfile"}],
                                model_family="sd1x", model_flavour=None,
                                pretrained_model_name_or_path="builtin:tiny-sd1x",
                                base_model_precision="no_change")
        self.assertIn("key 'eval_dataset_id' picks the edit pairs that validation edits", message)
        self.assertNotIn("did you mean", message)

    def test_validation_using_datasets_points_to_eval_dataset_id(self):
        message = self.problems(edit_datasets(self.targets, self.references),
                                validation_using_datasets=True)
        self.assertIn("validation_using_datasets", message)
        self.assertIn("eval_dataset_id", message)


if __name__ == "__main__":
    unittest.main()
