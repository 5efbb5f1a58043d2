"""AuraFlow (model_family auraflow): the adapter gives the transformer what AuraFlowPipeline
gives it (the pipeline's own UMT5 features with the padding zeroed, sigma as the timestep) and
trains it on the velocity the pipeline's Euler scheduler steps with; full and LoRA runs of
builtin:tiny-auraflow through the Trainer in-process validate, and export what
AuraFlowPipeline.from_pretrained loads: the trained weights, and a LoRA that changes its images."""

from __future__ import annotations

import unittest
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from diffusers import AuraFlowPipeline

from model_fixtures import TinyModelCase, random_batch
from simpletuner.configuration import load_configuration
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.layout import guess_family
from simpletuner.training.recipe import Trainer
from training_fixtures import make_shapes, write_config

PROMPTS = ("a red circle", "a small blue square standing on a long wooden table at dusk")
RUNS = {"full": {}, "lora": {"model_type": "lora", "lora_rank": 4, "learning_rate": 5e-2}}


def sample(pipeline: AuraFlowPipeline, **arguments) -> np.ndarray:
    """The first image of a seeded two-step call (its latents with output_type "latent")."""
    pipeline.set_progress_bar_config(disable=True)
    image = pipeline("a red circle", width=64, height=64, num_inference_steps=2,
                     generator=torch.Generator().manual_seed(0),
                     **arguments).images[0]
    return np.asarray(image, dtype=np.float32)


class AuraFlowTest(TinyModelCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()  # the model cache
        make_shapes(cls.cache / "data", per_size=4, sizes=((64, 64),))
        accelerator = Accelerator(cpu=True)
        cls.trainers = {}
        for name, options in RUNS.items():
            config = write_config(
                cls.cache, cls.cache / "data", name, model_family="auraflow",
                pretrained_model_name_or_path="builtin:tiny-auraflow", max_train_steps=2,
                validation_steps=2, validation_prompt="a red circle",
                validation_num_inference_steps=2, **options)
            cls.trainers[name] = Trainer(load_configuration(config), accelerator)
            cls.trainers[name].run()

    def test_the_network_gets_what_auraflowpipeline_gives_it(self):
        adapter = self.load("auraflow")
        seen = {}

        def keep(module, args, kwargs):
            seen.update(kwargs, hidden_states=args[0])

        hook = adapter.transformer.register_forward_pre_hook(keep, with_kwargs=True)
        pipeline = adapter.build_pipeline()
        pipeline.set_progress_bar_config(disable=True)
        pipeline(PROMPTS[0], width=64, height=64, num_inference_steps=1, guidance_scale=1.0,
                 output_type="latent")
        hook.remove()
        embeds = adapter.encode_prompts([PROMPTS[0]])["prompt_embeds"]
        self.assertTrue(torch.equal(seen["encoder_hidden_states"], embeds))
        self.assertEqual(tuple(embeds.shape), (1, 256, 32))
        # The padding after the caption's tokens (and </s>) reads as zeros.
        tokens = len(pipeline.tokenizer(PROMPTS[0]).input_ids)
        self.assertTrue(torch.all(embeds[0, tokens:] == 0))
        self.assertTrue(torch.all(embeds[0, :tokens].abs().sum(-1) > 0))
        # Its timestep is the scheduler's sigma (t / 1000): 1 at the first step.
        sigma = pipeline.scheduler.sigmas[0].item()
        self.assertAlmostEqual(seen["timestep"].item(), sigma, places=6)
        self.assertAlmostEqual(sigma, 1.0, places=6)
        self.assertEqual(tuple(seen["hidden_states"].shape), (1, 4, 8, 8))

    def test_the_loss_is_on_the_velocity_at_timestep_sigma(self):
        adapter = self.load("auraflow")
        batch = random_batch(adapter, 2, 64, 96, prompts=PROMPTS)
        loss, seen = self.capture_network_inputs(adapter, batch)
        clean = batch.latents.float()
        self.assertEqual(tuple(seen["hidden_states"].shape), (2, 4, 8, 12))
        sigma = seen["timestep"].view(-1, 1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)
        self.assertAlmostEqual(loss.item(), (noise - clean).pow(2).mean().item(), places=4)
        self.assertNotIn("encoder_attention_mask", seen)

    def test_the_builtin_folder_is_told_apart_as_auraflow(self):
        self.assertEqual(guess_family(ensure_builtin_model("tiny-auraflow")), "auraflow")

    def test_full_training_validates_and_exports_what_auraflowpipeline_loads(self):
        trainer = self.trainers["full"]
        out = Path(trainer.configuration.training.output_dir)
        self.assertTrue((out / "validation" / "step-2" / "grid.png").is_file())
        loaded = AuraFlowPipeline.from_pretrained(out / "pipeline")
        trained = trainer.adapter.trainable.state_dict()
        untrained = self.load("auraflow").transformer.state_dict()
        self.assertTrue(any(not torch.equal(untrained[key], value)
                            for key, value in trained.items()))
        for key, value in loaded.transformer.state_dict().items():
            self.assertTrue(torch.equal(value, trained[key]), key)
        self.assertGreater(sample(loaded).std(), 0.0)

    def test_the_lora_changes_the_base_pipelines_output(self):
        out = Path(self.trainers["lora"].configuration.training.output_dir)
        self.assertFalse((out / "pipeline").exists())
        pipeline = AuraFlowPipeline.from_pretrained(ensure_builtin_model("tiny-auraflow"))
        before = sample(pipeline, output_type="latent")
        pipeline.load_lora_weights(out / "lora")
        # The untrained tiny model answers two LoRA steps weakly, but far above float
        # rounding (1e-7); the decoded images flatten it, so the latents are compared.
        change = np.abs(sample(pipeline, output_type="latent") - before).mean()
        self.assertGreater(change, 1e-4 * np.abs(before).mean(), change)


if __name__ == "__main__":
    unittest.main()
