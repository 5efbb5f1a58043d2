"""The conformance suite every model family runs, in-process (the Trainer built in the test
process, as tests/test_trainer_in_process.py does; ./train.sh and `python -m simpletuner.train`
are tested once per launcher path, in test_train_sh.py and the TrainingRuns classes):

- a tiny full run of 4 steps, checkpointed at 2 and validated at the end, changes the trained
  network, and resumed from checkpoint-2 ends with bit-equal weights;
- its export loads with the family's own pipeline class (the base model's model_index.json
  names it), holds the trained weights and generates;
- a LoRA run, resumed the same way, ends with the bit-equal adapter, and its export loads onto
  the base pipeline and changes what it generates.

A family (or flavour) is covered by one row of CASES; tests/test_family_conformance_*.py turn
each row into a TestCase class of its own (``case_classes``), so pytest-xdist can spread them.
"""

from __future__ import annotations

import gc
import json
import re
import shutil
import tempfile
import unittest
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from accelerate import Accelerator
from PIL import Image

from edit_fixtures import circle, edit_datasets, make_edit_pairs
from simpletuner.configuration import load_configuration
from simpletuner.families import family_spec
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.pipelines import first_image, size_arguments
from simpletuner.models.registry import get_adapter_class
from simpletuner.training.adapters.lora import load_lora_file
from simpletuner.training.recipe import Trainer
from training_fixtures import make_shapes, write_config
from video_fixtures import shapes_frame, write_clip


class Case(NamedTuple):
    family: str
    flavour: str | None
    model: str  # a built-in tiny model: builtin:<model>
    dataset: str  # "image", "video" (clips) or "edit" (targets with their references)


# Every family and flavour the trainer supports, by its built-in tiny model: a family's row is
# its part of this suite (test_family_conformance.py checks that every registered family and
# every built-in model its spec names has one).
CASES = (
    Case("sd1x", None, "tiny-sd1x", "image"),
    Case("sd2x", None, "tiny-sd2x", "image"),
    Case("sdxl", None, "tiny-sdxl", "image"),
    Case("sd3", None, "tiny-sd3", "image"),
    Case("flux", None, "tiny-flux", "image"),
    Case("flux", "kontext", "tiny-flux-kontext", "edit"),
    Case("chroma", None, "tiny-chroma", "image"),
    Case("qwen_image", None, "tiny-qwen_image", "image"),
    Case("qwen_image", "edit-v1", "tiny-qwen_image-edit", "edit"),
    Case("qwen_image", "edit-v2", "tiny-qwen_image-edit-plus", "edit"),
    Case("z_image", None, "tiny-z_image", "image"),
    Case("lumina2", None, "tiny-lumina2", "image"),
    Case("sana", None, "tiny-sana", "image"),
    Case("auraflow", None, "tiny-auraflow", "image"),
    Case("krea2", None, "tiny-krea2", "image"),
    Case("ernie", None, "tiny-ernie", "image"),
    Case("ideogram", None, "tiny-ideogram", "image"),
    Case("qwen_image", "v2.1", "tiny-qwen_image-v2.1", "image"),
    Case("flux2", None, "tiny-flux2", "image"),
    Case("wan", None, "tiny-wan", "image"),  # images as one-frame clips
    Case("wan", "i2v-480p-14b-2.1", "tiny-wan-i2v", "video"),
    Case("wan", "t2v-14b-2.2-high", "tiny-wan22", "image"),
    Case("wan", "ti2v-5b-2.2", "tiny-wan22-ti2v", "image"),
    Case("ltxvideo", None, "tiny-ltxvideo", "image"),  # images as one-frame clips
    Case("ltxvideo2", None, "tiny-ltxvideo2", "image"),  # likewise, video-only
    Case("kolors", None, "tiny-kolors", "image"),
    Case("hidream", None, "tiny-hidream", "image"),
    Case("pixart_sigma", None, "tiny-pixart_sigma", "image"),
    Case("kandinsky5_image", None, "tiny-kandinsky5_image", "image"),
    Case("longcat_image", None, "tiny-longcat_image", "image"),
    Case("longcat_image", "edit", "tiny-longcat_image-edit", "edit"),
    Case("kandinsky5_image", "i2i-lite-sft", "tiny-kandinsky5_image-i2i", "edit"),
    Case("hunyuanvideo", None, "tiny-hunyuanvideo", "image"),  # images as one-frame clips
    Case("hunyuanvideo", "i2v-480p", "tiny-hunyuanvideo-i2v", "video"),
    Case("sanavideo", None, "tiny-sanavideo", "image"),  # images as one-frame clips
)

# What each model needs beyond the table, until the registry says it: training options, the
# arguments of a generation (its size first), and how much a LoRA changes that generation at
# least (mean absolute difference of 0-255 pixels; the video models' clips move less).
TRAINING_OPTIONS = {
    "tiny-wan-i2v": dict(resolution=48, train_batch_size=1),
    "tiny-wan22-ti2v": dict(aspect_bucket_alignment=32),
    "tiny-hunyuanvideo-i2v": dict(resolution=48, train_batch_size=1),
}
# The LoRA runs of these train on an int8 base (torchao), as on one small GPU; the exported
# adapter still loads onto the unquantized base pipeline.
LORA_OPTIONS = {model: dict(base_model_precision="int8-torchao")
                for model in ("tiny-qwen_image", "tiny-z_image", "tiny-flux2")}
# The untrained tiny AuraFlow's decoder flattens what a few steps change (0.006 of 255 per pixel
# at this rate, 0.0014 at 1e-2): a larger step, and LORA_CHANGE's smaller bound, show it.
LORA_OPTIONS.update({model: dict(learning_rate=5e-2) for model in (
    "tiny-auraflow", "tiny-ernie", "tiny-ideogram", "tiny-qwen_image-v2.1")})
GENERATION = {
    "tiny-flux-kontext": dict(width=64, height=64, _auto_resize=False, max_area=64 * 64),
    "tiny-qwen_image-edit": dict(width=64, height=64, true_cfg_scale=1.0),
    "tiny-qwen_image-edit-plus": dict(width=64, height=64, true_cfg_scale=1.0),
    "tiny-z_image": dict(guidance_scale=0.0),
    "tiny-sana": dict(use_resolution_binning=False),  # the size asked for, not a bin's
    "tiny-pixart_sigma": dict(use_resolution_binning=False),
    # its 2048-token default padding through a 36-layer encoder takes minutes on a CPU
    "tiny-ideogram": dict(max_sequence_length=64, guidance_scale=3.0, guidance_schedule=None),
    "tiny-flux2": dict(width=48, height=32, guidance_scale=1.0),
    "tiny-longcat_image": dict(enable_prompt_rewrite=False),
    # it samples at about 1 MP whatever the reference's size: one step, no unconditional pass
    "tiny-longcat_image-edit": dict(num_inference_steps=1, guidance_scale=1.0),
    "tiny-wan": dict(num_frames=1),
    "tiny-wan-i2v": dict(width=64, height=48, num_frames=5),
    "tiny-wan22": dict(width=64, height=64, num_frames=5, num_inference_steps=4),
    "tiny-wan22-ti2v": dict(width=64, height=64, num_frames=5),
    "tiny-ltxvideo": dict(num_frames=1),
    # its default spatio-temporal guidance block (28) is past the tiny model's two
    "tiny-ltxvideo2": dict(num_frames=1, stg_scale=0.0, audio_stg_scale=0.0),
    "tiny-hunyuanvideo": dict(width=64, height=48, num_frames=5),
    "tiny-hunyuanvideo-i2v": dict(width=64, height=48, num_frames=5),
    "tiny-sanavideo": dict(width=64, height=64, frames=5, use_resolution_binning=False),
}
LORA_CHANGE = {"tiny-wan": 1e-3, "tiny-wan-i2v": 1e-3, "tiny-wan22": 1e-4,
               "tiny-wan22-ti2v": 1e-3, "tiny-auraflow": 1e-3, "tiny-ltxvideo": 1e-3,
               "tiny-ltxvideo2": 1e-3, "tiny-hunyuanvideo": 1e-3, "tiny-hunyuanvideo-i2v": 1e-3,
               "tiny-sanavideo": 1e-3}  # an unchanged output is 0.0
IMAGE_LORA_CHANGE = 0.1
STEPS, RESUME_STEP = 4, 2
# Ideogram's validation pads prompts to 2048 tokens for a 36-layer encoder (minutes on a CPU);
# its pipeline is run by generate() with shorter prompts instead.
UNVALIDATED = ("tiny-ideogram",)


def case_name(case: Case) -> str:
    """A class name for the row: FluxKontextConformanceTest, WanI2v480p14b21ConformanceTest."""
    words = re.split(r"[^0-9a-zA-Z]+", f"{case.family}_{case.flavour or ''}")
    return "".join(word.capitalize() for word in words) + "ConformanceTest"


def is_video_model(case: Case) -> bool:
    return family_spec(case.family).frame_rule is not None


def is_image_to_video(case: Case) -> bool:
    return case.dataset == "video"


def pipeline_class(case: Case):
    """The family's own pipeline class, as the base model's model_index.json names it."""
    import diffusers

    index = json.loads((ensure_builtin_model(case.model) / "model_index.json").read_text())
    return getattr(diffusers, index["_class_name"])


def load_pipeline(case: Case, folder: Path):
    """``folder`` loaded with the family's pipeline class (Qwen-Image-Edit's processor is built
    here: transformers' own needs torchvision)."""
    extra = {}
    if case.model.startswith("tiny-qwen_image-edit"):
        from simpletuner.families.qwen_image.processor import load_processor

        extra["processor"] = load_processor(folder)
    if case.model == "tiny-kandinsky5_image-i2i":  # its tokenizer is a Qwen2VLProcessor
        from simpletuner.families.qwen_image.processor import load_processor

        extra["tokenizer"] = load_processor(folder, "tokenizer")
    if case.model.startswith("tiny-longcat_image"):
        from simpletuner.families.qwen_image.processor import load_processor

        extra["text_processor"] = load_processor(folder, "text_processor")
    if case.model == "tiny-qwen_image-v2.1":
        from simpletuner.families.qwen_image.v21_processor import ImageTextQwen3VLProcessor

        extra["processor"] = ImageTextQwen3VLProcessor.from_pretrained(folder,
                                                                       subfolder="processor")
    pipeline = pipeline_class(case).from_pretrained(folder, **extra)
    if case.family == "hidream":  # its area as the adapter's pipeline has it (1 MP otherwise)
        pipeline.default_sample_size = pipeline.transformer.config.max_resolution[0]
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def generate(case: Case, pipeline) -> np.ndarray:
    """What the pipeline makes of a fixed prompt (and reference or first frame), seed 0, as
    float64 pixels: an image [H, W, 3] or a clip [F, H, W, 3]."""
    call = {"width": 96, "height": 64, "num_inference_steps": 2, **GENERATION.get(case.model, {})}
    if case.dataset == "edit":
        reference = circle("red", "blue", (call["width"], call["height"]))
        call["image"] = [reference] if case.flavour == "edit-v2" else reference
    if is_image_to_video(case):
        call["image"] = Image.fromarray(shapes_frame(call["width"], call["height"], 0, seed=1))
    if is_video_model(case):
        call["output_type"] = "np"
    if not size_arguments(pipeline, call["width"], call["height"]):
        del call["width"], call["height"]  # sized from its image or reference (HunyuanVideo
        # 1.5 I2V; LongCat-Image-Edit: about 1 MP, the reference's shape)
    if hasattr(pipeline, "resolutions"):  # Kandinsky 5: else its nearest 1 MP size
        pipeline.resolutions = [(call["width"], call["height"])]
    result = pipeline(prompt="a red circle", generator=torch.Generator().manual_seed(0), **call)
    if is_video_model(case):
        return result.frames[0].astype(np.float64)
    return np.asarray(first_image(result)).astype(np.float64)


def make_dataset(case: Case, root: Path) -> tuple[Path, list[dict]]:
    """The case's training data under ``root``: its folder and multidatabackend.json entries."""
    if case.dataset == "edit":
        targets, references, _ = make_edit_pairs(root, count=4)
        return targets, edit_datasets(targets, references)
    if case.dataset == "video":
        clips = root / "clips"
        for i in range(4):
            write_clip(clips / f"walk{i}.mp4", 64, 48, 9, seed=i,
                       caption=f"a square walking, take {i}")
        return clips, [{"id": "clips", "dataset_type": "video", "instance_data_dir": str(clips),
                        "video": {"bucket_strategy": "resolution_frames"}}]
    data = root / "data"
    make_shapes(data, per_size=4, sizes=((64, 64),))
    return data, [{"id": "shapes", "instance_data_dir": str(data),
                   "caption_strategy": "textfile"}]


def validation_options(case: Case) -> dict:
    """A one-step validation at the end of the full run where a prompt alone can be validated
    (an edit model edits references, an image-to-video model animates training clips')."""
    if case.dataset == "edit" or case.model in UNVALIDATED:
        return {}
    options = dict(validation_prompt="a red circle", validation_num_inference_steps=1,
                   validation_resolution=64)
    if is_image_to_video(case):
        options.update(validation_using_datasets=True, validation_resolution="64x48")
    if is_video_model(case):  # the shortest clip of more than one frame its VAE encodes
        rule = family_spec(case.family).frame_rule
        options.update(validation_num_video_frames=rule.remainder + rule.multiple)
    return options


def network_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The trained parameters (a LoRA's adapter; a full run's whole network), copied."""
    return {name: parameter.detach().clone()
            for name, parameter in trainer.parts.network.named_parameters()
            if parameter.requires_grad}


class Run(NamedTuple):
    """A run of STEPS steps and its twin resumed from checkpoint-RESUME_STEP: the network's
    weights before and after the run, after the resumed run, the step the twin resumed at, and
    the output folder they shared."""
    start: dict
    end: dict
    resumed: dict
    resumed_at: int
    out: Path


class ResumedRuns:
    """Mixed into a unittest.TestCase whose ``case`` is a row of CASES (or a Case of its own):
    runs of it in this process, each resumed (``run_and_resume``), under a folder ``root`` on
    the data ``data`` and datasets ``datasets`` that setUpClass leaves on the class."""

    case: Case

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix=f"st-conformance-{cls.case.model}-"))
        cls.addClassCleanup(shutil.rmtree, cls.root, ignore_errors=True)
        cls.accelerator = Accelerator(cpu=True)
        cls.data, cls.datasets = cls.make_dataset()

    @classmethod
    def make_dataset(cls) -> tuple[Path, list[dict]]:
        return make_dataset(cls.case, cls.root)

    @classmethod
    def trainer(cls, name: str, **options) -> Trainer:
        case = cls.case
        settings = dict(model_family=case.family, model_flavour=case.flavour,
                        pretrained_model_name_or_path=f"builtin:{case.model}",
                        max_train_steps=STEPS, checkpointing_steps=RESUME_STEP,
                        **TRAINING_OPTIONS.get(case.model, {}), **options)
        config = write_config(cls.root, cls.data, name, datasets=cls.datasets, **settings)
        trainer = Trainer(load_configuration(config), cls.accelerator)
        trainer.set_up()
        return trainer

    @classmethod
    def run_and_resume(cls, name: str, **options) -> Run:
        """Run ``name`` to the end and export it; then, as if it had been killed after
        checkpoint-RESUME_STEP, remove its later checkpoint and resume it ("latest") in the
        same output folder (its caches reused) to the end and export again."""
        trainer = cls.trainer(name, **options)
        start = network_weights(trainer)
        trainer.train()
        trainer.export()
        end = network_weights(trainer)
        del trainer
        gc.collect()
        out = cls.root / f"{name}-out"
        shutil.rmtree(out / f"checkpoint-{STEPS}")
        resumed = cls.trainer(name, resume_from_checkpoint="latest", **options)
        resumed_at = resumed.state.step
        resumed.train()
        resumed.export()
        weights = network_weights(resumed)
        del resumed
        gc.collect()
        return Run(start, end, weights, resumed_at, out)

    def assert_trained_and_resumed_exactly(self, run: Run) -> None:
        self.assertEqual(run.resumed_at, RESUME_STEP)
        self.assertTrue(any(not torch.equal(run.start[k], run.end[k]) for k in run.start),
                        "training left every weight as it was")
        self.assertEqual(set(run.end), set(run.resumed))
        for name, tensor in run.end.items():
            self.assertTrue(torch.equal(tensor, run.resumed[name]),
                            f"{name}: the resumed run differs by up to "
                            f"{(tensor.float() - run.resumed[name].float()).abs().max().item()}")



class FamilyConformance(ResumedRuns):
    """Mixed into a unittest.TestCase whose ``case`` is a row of CASES: its full and LoRA runs,
    each resumed, are made once for the class, in this process."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.full = cls.run_and_resume("full", **validation_options(cls.case))
        lora_options = {"learning_rate": 1e-2 if cls.case.dataset != "video" else 3e-2,
                        **LORA_OPTIONS.get(cls.case.model, {})}
        cls.lora = cls.run_and_resume("lora", model_type="lora", lora_rank=4, **lora_options)

    def test_a_full_run_trains_and_its_resumed_twin_ends_with_the_same_weights(self):
        self.assert_trained_and_resumed_exactly(self.full)

    def test_the_full_export_is_the_familys_pipeline_with_the_trained_weights(self):
        folder = self.full.out / "pipeline"
        pipeline = load_pipeline(self.case, folder)
        index = json.loads((folder / "model_index.json").read_text())
        self.assertEqual(index["_class_name"], pipeline_class(self.case).__name__)
        component = json.loads((ensure_builtin_model(self.case.model) / "model_index.json")
                               .read_text())
        exported = getattr(pipeline, "unet" if "unet" in component else "transformer")
        exported = exported.state_dict()
        for name, tensor in self.full.end.items():
            self.assertTrue(torch.equal(exported[name], tensor), name)
        self.assertGreater(generate(self.case, pipeline).std(), 0.0)
        if validation_options(self.case):
            step = self.full.out / "validation" / f"step-{STEPS}"
            shown = "clip-00.webp" if is_video_model(self.case) else "grid.png"
            self.assertTrue((step / shown).is_file(), sorted(p.name for p in step.glob("*")))

    def test_a_lora_run_trains_and_its_resumed_twin_ends_with_the_same_adapter(self):
        self.assert_trained_and_resumed_exactly(self.lora)

    def test_the_lora_export_loads_onto_the_base_pipeline_and_changes_its_output(self):
        self.assertFalse((self.lora.out / "pipeline").exists())
        pipeline = load_pipeline(self.case, ensure_builtin_model(self.case.model))
        before = generate(self.case, pipeline)
        load_lora_file(get_adapter_class(self.case.family), pipeline, self.lora.out / "lora")
        change = np.abs(generate(self.case, pipeline) - before).mean()
        self.assertGreater(change, LORA_CHANGE.get(self.case.model, IMAGE_LORA_CHANGE))


def case_classes(module: str, families: tuple[str, ...]) -> dict[str, type]:
    """One TestCase class per row of CASES whose family is in ``families``, named by
    case_name, for module ``module``'s globals."""
    return {case_name(case): type(case_name(case), (FamilyConformance, unittest.TestCase),
                                  {"case": case, "__module__": module})
            for case in CASES if case.family in families}
