"""Qwen-Image-Edit (model_family qwen_image, model_flavour edit-v1, and edit-v2 with several
references): the transformer and the text encoder get each pair as QwenImageEditPipeline (or
QwenImageEditPlusPipeline) gives them (the prompt read with its references, their packed
latents appended, img_shapes listing them all), and text entries are keyed by caption and
references; a full edit-v1 run leaves orphans out, resumes with the rest of its trace, and
exports its processor as Qwen2VLProcessor reads it (the tests load it with the processor built
here, which needs no torchvision); an edit-v2 LoRA trains on two references per target and
changes the Plus pipeline's transformer. Training, resume and export in general: the conformance suite
(tests/conformance.py)."""

from __future__ import annotations

import json
import tempfile
import unittest
from dataclasses import replace
from pathlib import Path

import torch
from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
    CONDITION_IMAGE_SIZE, calculate_dimensions as plus_dimensions)

from edit_fixtures import circle, edit_datasets, make_edit_pairs
from model_fixtures import CPU, network_prediction
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.multiaspect.image import to_tensor
from simpletuner.models.base import LossSettings
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model, resolve_model_path
from simpletuner.families.qwen_image.processor import load_processor
from simpletuner.models.registry import get_adapter_class
from trained_outputs import TRANSFORMER_WEIGHTS, TrainedOutputAssertions
from training_fixtures import TrainingRuns, read_jsonl, run_in_process, write_config

EDIT = dict(model_family="qwen_image", model_flavour="edit-v1",
            pretrained_model_name_or_path="builtin:tiny-qwen_image-edit")
PLUS = "builtin:tiny-qwen_image-edit-plus"
PROMPTS = ["make the circle red", "make the circle a much deeper shade of blue"]


def load_edit_adapter():
    return get_adapter_class("qwen_image").load(
        ensure_builtin_model("tiny-qwen_image-edit"), device=CPU, weight_dtype=torch.float32,
        loss_settings=LossSettings())


class QwenEditAdapterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.adapter = load_edit_adapter()
        cls.pipeline = cls.adapter.build_pipeline()
        cls.references = [circle("green", "blue", (64, 96)), circle("yellow", "red", (64, 96))]
        pixels = torch.stack([to_tensor(image) for image in cls.references])
        targets = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(3)) * 2 - 1
        cls.batch = TrainingBatch(
            latents=cls.adapter.encode_images(targets),
            prompt_embeds=cls.adapter.encode_prompts(PROMPTS, [[i] for i in cls.references]),
            original_sizes=[(64, 64)] * 2, crop_top_lefts=[(0, 0)] * 2,
            target_sizes=[(64, 64)] * 2, reference_latents=(cls.adapter.encode_images(pixels),))

    def test_the_network_gets_the_pair_as_qwen_image_edit_pipeline_gives_it(self):
        seen = {}

        def zero_network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        loss = self.adapter.compute_loss(self.batch, torch.Generator().manual_seed(5),
                                         network=zero_network)
        pipeline = self.pipeline
        self.assertIsInstance(pipeline, QwenImageEditPipeline)
        # the pipeline's text encoder reads the reference resized to about 1 MP
        width, height, _ = calculate_dimensions(1024 * 1024, 64 / 96)
        shown = [pipeline.image_processor.resize(image, height, width)
                 for image in self.references]
        embeds, mask = pipeline.encode_prompt(PROMPTS, image=shown, device=CPU)
        torch.testing.assert_close(seen["encoder_hidden_states"], embeds)
        self.assertTrue(torch.equal(seen["encoder_hidden_states_mask"], mask))
        pixels = pipeline.image_processor.preprocess(self.references, 96, 64).unsqueeze(2)
        _, image_latents = pipeline.prepare_latents(pixels, 2, 16, 64, 64, torch.float32, CPU,
                                                    torch.Generator().manual_seed(0))
        tokens = (64 // 16) ** 2  # 8x VAE, 2x2 packing
        self.assertEqual(seen["hidden_states"].shape[1], tokens + (96 // 16) * (64 // 16))
        torch.testing.assert_close(seen["hidden_states"][:, tokens:], image_latents)
        # as the pipeline builds it: the target's (1, 64/16, 64/16), the reference's 96 x 64
        self.assertEqual(seen["img_shapes"], [[(1, 4, 4), (1, 6, 4)]] * 2)
        # the loss covers the noisy image's tokens only: zero prediction = mean square target
        noisy = seen["hidden_states"][:, :tokens]
        sigma = seen["timestep"].view(-1, 1, 1)
        packed = pipeline._pack_latents(self.batch.latents, 2, 16, 8, 8)
        noise = (noisy - (1 - sigma) * packed) / sigma
        self.assertAlmostEqual(loss.item(), (noise - packed).pow(2).mean().item(), places=4)

    def test_the_reference_changes_the_prompt_embeddings_and_the_prediction(self):
        swapped = self.adapter.encode_prompts(PROMPTS, [[i] for i in self.references[::-1]])
        own = self.batch.prompt_embeds["prompt_embeds"]
        self.assertGreater((swapped["prompt_embeds"][0] - own[0]).abs().max().item(), 1e-4)
        other = replace(self.batch, reference_latents=(torch.flip(
            self.batch.reference_latents[0], dims=[0]),))
        first = network_prediction(self.adapter, self.batch)[:, :16]
        second = network_prediction(self.adapter, other)[:, :16]
        self.assertGreater((first - second).abs().mean().item(), 1e-4)

    def test_a_prompt_without_its_reference_is_refused(self):
        with self.assertRaisesRegex(ValueError, "reads each prompt with its reference images"):
            self.adapter.encode_prompts(PROMPTS)
        with self.assertRaisesRegex(ValueError, r"\(1 to 1\)"):
            self.adapter.encode_prompts(PROMPTS, [self.references, self.references])

    def test_the_flavour_and_the_folder_must_agree(self):
        qwen = get_adapter_class("qwen_image")
        problem = qwen.flavour_problem(ensure_builtin_model("tiny-qwen_image"), "edit-v1")
        self.assertIn("QwenImageEditPipeline", problem)
        self.assertIn("builtin:tiny-qwen_image-edit", problem)
        self.assertIn("model_flavour 'edit-v1'",
                      qwen.flavour_problem(ensure_builtin_model("tiny-qwen_image-edit"), None))
        self.assertIsNone(qwen.flavour_problem(ensure_builtin_model("tiny-qwen_image"), None))


class QwenEditPlusAdapterTest(unittest.TestCase):
    """edit-v2: two references per sample, as QwenImageEditPlusPipeline gives them."""

    def test_the_network_gets_both_references_as_the_plus_pipeline_gives_them(self):
        adapter = get_adapter_class("qwen_image").load(
            ensure_builtin_model("tiny-qwen_image-edit-plus"), device=CPU,
            weight_dtype=torch.float32, loss_settings=LossSettings())
        pipeline = adapter.build_pipeline()
        self.assertIsInstance(pipeline, QwenImageEditPlusPipeline)
        first = [circle("green", "blue", (64, 96)), circle("yellow", "red", (64, 96))]
        second = [circle("red", "green", (64, 64)), circle("blue", "yellow", (64, 64))]
        pairs = [[a, b] for a, b in zip(first, second)]
        batch = TrainingBatch(
            latents=torch.zeros(2, 16, 8, 8), prompt_embeds=adapter.encode_prompts(PROMPTS, pairs),
            original_sizes=[(64, 64)] * 2, crop_top_lefts=[(0, 0)] * 2,
            target_sizes=[(64, 64)] * 2,
            reference_latents=tuple(adapter.encode_images(torch.stack([to_tensor(i) for i in
                                                                       images]))
                                    for images in (first, second)))
        seen = {}

        def zero_network(**inputs):
            seen.update(inputs)
            return (torch.zeros_like(inputs["hidden_states"]),)

        adapter.compute_loss(batch, torch.Generator().manual_seed(5), network=zero_network)
        for row, images in enumerate(pairs):  # the Plus pipeline encodes one prompt per call
            shown = []
            for image in images:
                width, height = plus_dimensions(CONDITION_IMAGE_SIZE, image.width / image.height)
                shown.append(pipeline.image_processor.resize(image, height, width))
            embeds, _ = pipeline.encode_prompt([PROMPTS[row]], image=shown, device=CPU)
            length = embeds.shape[1]
            torch.testing.assert_close(seen["encoder_hidden_states"][row, :length], embeds[0])
            self.assertEqual(int(seen["encoder_hidden_states_mask"][row].sum()), length)
        vae_images = [pipeline.image_processor.preprocess(images, image_height, 64).unsqueeze(2)
                      for images, image_height in ((first, 96), (second, 64))]
        _, image_latents = pipeline.prepare_latents(vae_images, 2, 16, 64, 64, torch.float32,
                                                    CPU, torch.Generator().manual_seed(0))
        torch.testing.assert_close(seen["hidden_states"][:, 16:], image_latents)
        self.assertEqual(seen["img_shapes"], [[(1, 4, 4), (1, 6, 4), (1, 4, 4)]] * 2)


class QwenEditConfigTest(unittest.TestCase):
    def problems(self, datasets, **options) -> list[str]:
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        targets, references, _ = make_edit_pairs(root, count=1)
        config = write_config(root, targets, datasets=datasets(targets, references),
                              **{**EDIT, **options})
        with self.assertRaises(ConfigError) as caught:
            load_configuration(config, cwd=root)
        return caught.exception.problems

    def test_validation_from_a_prompt_alone_is_refused(self):
        (problem,) = self.problems(edit_datasets, validation_prompt="make the circle red")
        self.assertIn("key 'validation_prompt': a Qwen-Image-Edit pipeline edits a reference",
                      problem)
        self.assertIn("set eval_dataset_id", problem)

    def test_more_references_than_the_flavour_reads_are_refused(self):
        def with_references(count):
            def datasets(targets, references):
                edits, conditioning = edit_datasets(targets, references)
                extra = [{**conditioning, "id": f"refs-{i}"} for i in range(count)]
                return [{**edits, "conditioning_data": [e["id"] for e in extra]}, *extra]
            return datasets

        (problem,) = self.problems(with_references(2))
        self.assertIn("names 2 conditioning datasets, but model_flavour 'edit-v1' reads at most "
                      "1", problem)
        self.assertIn("use model_flavour 'edit-v2'", problem)
        problems = self.problems(with_references(4), model_flavour="edit-v2",
                                 pretrained_model_name_or_path=PLUS)
        self.assertIn("'edit-v2' reads at most 3 reference(s)", " ".join(problems))


class QwenEditTrainingTest(TrainingRuns, TrainedOutputAssertions, unittest.TestCase):
    """In this process, on 4 edit pairs plus an orphan on each side, 4 steps checkpointed at 2:
    edit-v1 full, and resumed from a copy of its checkpoint-2; an edit-v2 LoRA with two
    references per target."""

    tmp_prefix = "st-qwen-edit-"
    launch = staticmethod(run_in_process)
    options = dict(EDIT, max_train_steps=4, checkpointing_steps=2, train_batch_size=2,
                   trace_samples=True)

    @classmethod
    def start_runs(cls):
        root = cls.root
        cls.targets, cls.references, _ = make_edit_pairs(root, count=4)
        circle("red", "blue", (64, 64)).save(cls.targets / "lonely-target.png")
        (cls.targets / "lonely-target.txt").write_text("make the circle red")
        circle("red", "blue", (64, 64)).save(cls.references / "lonely-reference.jpg")
        cls.datasets = edit_datasets(cls.targets, cls.references)
        cls.train("full")
        cls.train_resumed("full", "resumed", launch=run_in_process)
        cls.train("lora", datasets=cls.two_reference_datasets(), model_type="lora", lora_rank=4,
                  learning_rate=1e-2, model_flavour="edit-v2", pretrained_model_name_or_path=PLUS)

    @classmethod
    def two_reference_datasets(cls) -> list[dict]:
        """The pairs with a second reference folder (same stems, .png) for edit-v2."""
        second_references = cls.root / "second-references"
        second_references.mkdir()
        for target in cls.targets.glob("??x??-*.png"):
            circle("yellow", "green", (64, 64)).save(second_references / target.name)
        edits, first = edit_datasets(cls.targets, cls.references)
        second = {**first, "id": "second-references", "instance_data_dir": str(second_references)}
        return [{**edits, "conditioning_data": ["edit-references", "second-references"]},
                first, second]

    def test_each_target_trains_with_its_own_reference_and_orphans_are_reported(self):
        out = self.root / "full-out"
        pairs = [(s, refs) for record in read_jsonl(out / "trace" / "rank-0.jsonl")
                 for s, refs in zip(record["samples"], record["references"])]
        self.assertEqual(len(pairs), 8)  # 4 steps of 2
        for sample_id, refs in pairs:
            self.assertEqual(refs, [sample_id.replace(".png", ".jpg")])
        skipped = json.loads((out / "skipped_files.json").read_text())
        self.assertEqual([e["path"] for e in skipped["edits"]], ["lonely-target.png"])
        self.assertEqual([e["path"] for e in skipped["edit-references"]],
                         ["lonely-reference.jpg"])
        # one text entry per caption and reference: the 4 pairs have 4 captions, 4 references
        self.assertEqual(len(list((out / "cache" / "text").rglob("*.safetensors"))), 4)

    def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights_and_trace(self):
        whole = self.root / "full-out" / TRANSFORMER_WEIGHTS
        self.assert_same_tensors(whole, self.root / "resumed-out" / TRANSFORMER_WEIGHTS)
        self.assert_some_tensor_changed(resolve_model_path("builtin:tiny-qwen_image-edit") /
                                        TRANSFORMER_WEIGHTS.removeprefix("pipeline/"), whole)
        whole, resumed = (read_jsonl(self.root / run / "trace" / "rank-0.jsonl")
                          for run in ("full-out", "resumed-out"))
        self.assertEqual(len(resumed), 2)  # steps 3 and 4, each with its references
        self.assertEqual(resumed, whole[2:])

    def test_the_export_saves_the_processor_as_qwen2vlprocessor_reads_it(self):
        folder = self.root / "full-out" / "pipeline"
        index = json.loads((folder / "model_index.json").read_text())
        self.assertEqual(index["processor"], ["transformers", "Qwen2VLProcessor"])
        # what Qwen2VLProcessor.from_pretrained reads where torchvision is installed
        processor = folder / "processor"
        self.assertEqual(json.loads((processor / "processor_config.json").read_text())[
            "processor_class"], "Qwen2VLProcessor")
        self.assertEqual(json.loads((processor / "video_preprocessor_config.json").read_text())[
            "video_processor_type"], "Qwen2VLVideoProcessor")
        self.assertEqual(json.loads((processor / "preprocessor_config.json").read_text())[
            "image_processor_type"], "Qwen2VLImageProcessor")
        self.assertTrue((processor / "tokenizer.json").is_file())
        # (that the pipeline loads with it and edits a reference: the conformance suite; that
        # the edit depends on its reference: QwenEditAdapterTest, without the 1 MP resize each
        # pipeline call makes of its reference)

    def test_the_edit_v2_lora_trains_on_two_references_and_loads_onto_the_plus_pipeline(self):
        for record in read_jsonl(self.root / "lora-out" / "trace" / "rank-0.jsonl"):
            self.assertEqual(record["references"], [[s.replace(".png", ".jpg"), s]
                                                    for s in record["samples"]])
        base = resolve_model_path(PLUS)
        pipeline = QwenImageEditPlusPipeline.from_pretrained(base, processor=load_processor(base))
        before = self.transformer_output(pipeline)
        pipeline.load_lora_weights(self.root / "lora-out" / "lora")
        self.assertGreater((self.transformer_output(pipeline) - before).abs().mean().item(), 1e-3)

    @staticmethod
    def transformer_output(pipeline) -> torch.Tensor:
        """The transformer's prediction for fixed inputs: a 4 x 4 target and a reference."""
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            return pipeline.transformer(
                hidden_states=torch.randn(1, 32, 64, generator=generator),
                encoder_hidden_states=torch.randn(1, 8, 32, generator=generator),
                encoder_hidden_states_mask=torch.ones(1, 8, dtype=torch.long),
                timestep=torch.tensor([0.5]), img_shapes=[[(1, 4, 4), (1, 4, 4)]],
                return_dict=False)[0]


if __name__ == "__main__":
    unittest.main()
