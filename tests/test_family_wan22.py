"""Wan 2.2 T2V-A14B, one expert trained per run: the noise levels drawn stay in the trained
expert's range and follow the configured distribution there; the trained expert gets, in
training, the inputs WanPipeline gives it in its own slot, and the frozen expert is the one
loaded; a two-expert folder needs an expert flavour; a LoRA of the low-noise expert loads into
transformer_2, and a full run of the high-noise expert exports the low-noise one as loaded.
TI2V-5B as text-to-video: the network gets the pipeline's per-token timesteps and the Wan 2.2
VAE's normalised latents. Training, resume and export (A14B's high-noise expert, TI2V-5B): the
conformance suite (tests/conformance.py)."""

from __future__ import annotations

import json
import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers import DiffusionPipeline, WanPipeline
from safetensors.torch import load_file

from model_fixtures import CPU, TinyModelCase, random_batch
from simpletuner.models.base import LossSettings
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model, resolve_model_path
from simpletuner.models.flow_objective import sample_sigmas
from simpletuner.models.registry import get_adapter_class
from simpletuner.models.sigma_range import sample_sigmas_in_range
from test_family_wan import SHARED_CONFIGS, WAN_PARAMETERS, transformer_config
from test_memory_plan_command import GIB, plan_in_process, row
from trained_outputs import TRANSFORMER_WEIGHTS, TrainedOutputAssertions
from training_fixtures import TrainingRuns, make_shapes, run_in_process, write_config

BOUNDARY = 0.875  # tiny-wan22's model_index.json, as Wan2.2-T2V-A14B-Diffusers'
EXPERT_WEIGHTS = "diffusion_pytorch_model.safetensors"


class SigmaRangeTest(unittest.TestCase):
    def test_levels_stay_in_range_and_follow_the_unrestricted_draws_there(self):
        for sampling in ("uniform", "logit_normal"):
            for shift in (1.0, 3.0, 12.0):
                # The reference: plain draws, the ones outside each range thrown away.
                plain = sample_sigmas(2000000, sampling=sampling, logit_mean=0.3, shift=shift,
                                      device=CPU, generator=torch.Generator().manual_seed(2))
                for low, high in ((BOUNDARY, 1.0), (0.0, BOUNDARY), (0.2, 0.5)):
                    with self.subTest(sampling=sampling, shift=shift, range=(low, high)):
                        drawn = sample_sigmas_in_range(
                            20000, low=low, high=high, sampling=sampling, logit_mean=0.3,
                            shift=shift, device=CPU, generator=torch.Generator().manual_seed(1))
                        self.assertTrue(bool(((drawn >= low) & (drawn <= high)).all()))
                        kept = plain[(plain >= low) & (plain <= high)]
                        self.assertGreater(len(kept), 2000)
                        quantiles = torch.tensor([0.1, 0.5, 0.9])
                        torch.testing.assert_close(torch.quantile(drawn, quantiles),
                                                   torch.quantile(kept, quantiles),
                                                   atol=0.01 * (high - low) + 1e-3, rtol=0)

    def test_the_same_generator_gives_the_same_levels(self):
        def draw():
            return sample_sigmas_in_range(8, low=0.0, high=BOUNDARY, sampling="logit_normal",
                                          shift=3.0, device=CPU,
                                          generator=torch.Generator().manual_seed(4))
        self.assertTrue(torch.equal(draw(), draw()))


class WanExpertAdapterTest(TinyModelCase):
    def load_expert(self, expert: str, **loss):
        return get_adapter_class("wan").load(
            ensure_builtin_model("tiny-wan22"), device=CPU, weight_dtype=torch.float32,
            loss_settings=LossSettings(model_flavour=f"t2v-14b-2.2-{expert}", **loss))

    def pipeline_inputs(self, pipeline) -> dict[str, list]:
        """Each slot's inputs over one 10-step generation."""
        seen = {"transformer": [], "transformer_2": []}
        hooks = [getattr(pipeline, slot).register_forward_hook(
            lambda module, args, kwargs, output, slot=slot: seen[slot].append(kwargs),
            with_kwargs=True) for slot in seen]
        try:
            pipeline.set_progress_bar_config(disable=True)
            pipeline(prompt="a red circle", height=32, width=32, num_frames=1,
                     num_inference_steps=10, guidance_scale=1.0, output_type="np",
                     generator=torch.Generator().manual_seed(0))
        finally:
            for hook in hooks:
                hook.remove()
        return seen

    def test_each_expert_trains_on_the_timesteps_its_pipeline_slot_gets(self):
        for expert, slot in (("high", "transformer"), ("low", "transformer_2")):
            with self.subTest(expert=expert):
                adapter = self.load_expert(expert)
                pipeline = adapter.build_pipeline()
                self.assertIs(getattr(pipeline, slot), adapter.transformer)
                self.assertEqual(pipeline.config.boundary_ratio, BOUNDARY)
                seen = self.pipeline_inputs(pipeline)
                self.assertTrue(seen["transformer"] and seen["transformer_2"])  # both denoise
                given = torch.cat([inputs["timestep"].float() for inputs in seen[slot]])
                batch = random_batch(adapter, 2, height=32, width=32)
                trained = []
                for seed in range(20):
                    _, inputs = self.capture_network_inputs(adapter, batch, seed=seed)
                    trained.append(inputs["timestep"])
                trained = torch.cat(trained)
                on_the_high_side = bool((given >= BOUNDARY * 1000).all())
                self.assertEqual(on_the_high_side, expert == "high")
                if expert == "high":
                    self.assertTrue(bool((trained >= BOUNDARY * 1000).all()), trained)
                else:
                    self.assertTrue(bool((trained < BOUNDARY * 1000).all()), trained)
                    self.assertTrue(bool((given < BOUNDARY * 1000).all()))
                # The same text embeddings as the pipeline's, the same latent layout.
                embeds, _ = pipeline.encode_prompt(["a red circle", "a blue square"],
                                                   do_classifier_free_guidance=False,
                                                   max_sequence_length=512, device=CPU)
                self.assertTrue(torch.equal(inputs["encoder_hidden_states"], embeds))
                self.assertEqual(inputs["hidden_states"].shape[1:],
                                 seen[slot][0]["hidden_states"].shape[1:])

    def test_the_frozen_expert_is_the_loaded_one_and_gets_no_gradient(self):
        adapter = self.load_expert("low")
        folder = ensure_builtin_model("tiny-wan22")
        loaded = load_file(str(folder / "transformer" / EXPERT_WEIGHTS))
        batch = random_batch(adapter, 2, height=32, width=32)
        adapter.compute_loss(batch, torch.Generator().manual_seed(0)).backward()
        frozen = adapter.frozen_expert.state_dict()
        self.assertEqual(set(frozen), set(loaded))
        for name, tensor in loaded.items():
            self.assertTrue(torch.equal(frozen[name], tensor), name)
        self.assertTrue(all(p.grad is None for p in adapter.frozen_expert.parameters()))
        self.assertGreater(adapter.transformer.proj_out.weight.grad.abs().sum().item(), 0)

    def test_block_swap_placement_moves_the_frozen_expert_and_leaves_the_host_block(self):
        adapter = self.load_expert("high")
        self.assert_block_swap_moves(adapter, adapter.frozen_expert)

    def test_a_two_expert_folder_needs_an_expert_flavour_and_one_transformer_refuses_it(self):
        wan = get_adapter_class("wan")
        two, one = ensure_builtin_model("tiny-wan22"), ensure_builtin_model("tiny-wan")
        for flavour in (None, "t2v-480p-14b-2.1"):
            self.assertRegex(wan.flavour_problem(two, flavour), "two-expert Wan 2.2 A14B.*"
                             "t2v-14b-2.2-high or t2v-14b-2.2-low")
        self.assertIsNone(wan.flavour_problem(two, "t2v-14b-2.2-high"))
        self.assertRegex(wan.flavour_problem(one, "t2v-14b-2.2-low"), "has one transformer")
        self.assertIsNone(wan.flavour_problem(one, None))


class WanTI2VAdapterTest(TinyModelCase):
    def test_the_network_gets_what_wan_pipeline_gives_it_per_token(self):
        adapter = get_adapter_class("wan").load(
            ensure_builtin_model("tiny-wan22-ti2v"), device=CPU, weight_dtype=torch.float32,
            loss_settings=LossSettings(model_flavour="ti2v-5b-2.2"))
        self.assertEqual(adapter.resolution_alignment, 32)  # 16x VAE, 2x2 transformer patches
        pixels = torch.rand(2, 3, 5, 64, 64, generator=torch.Generator().manual_seed(7))
        latents = adapter.encode_images(pixels * 2 - 1)
        self.assertEqual(tuple(latents.shape), (2, 48, 2, 4, 4))
        config = adapter.vae.config  # the pipeline decodes latents * std + mean
        mean = torch.tensor(config.latents_mean).view(1, 48, 1, 1, 1)
        std = torch.tensor(config.latents_std).view(1, 48, 1, 1, 1)
        raw = adapter.vae.encode(pixels * 2 - 1).latent_dist.mode()
        torch.testing.assert_close(latents * std + mean, raw, rtol=1e-4, atol=1e-5)
        batch = TrainingBatch(latents, adapter.encode_prompts(["a red circle", "a blue square"]),
                              [(64, 64)] * 2, [(0, 0)] * 2, [(64, 64)] * 2)
        _, trained = self.capture_network_inputs(adapter, batch)
        pipeline = adapter.build_pipeline()
        self.assertTrue(pipeline.config.expand_timesteps)
        given = []
        hook = pipeline.transformer.register_forward_hook(
            lambda module, args, kwargs, output: given.append(kwargs), with_kwargs=True)
        pipeline.set_progress_bar_config(disable=True)
        pipeline(prompt="a red circle", height=64, width=64, num_frames=5, num_inference_steps=2,
                 guidance_scale=1.0, output_type="np", generator=torch.Generator().manual_seed(0))
        hook.remove()
        # One timestep per latent token (2 frames x 2 x 2 patches), one value per sample.
        self.assertEqual(given[0]["timestep"].shape, (1, 8))
        self.assertEqual(trained["timestep"].shape, (2, 8))
        for timesteps in (given[0]["timestep"], trained["timestep"]):
            self.assertTrue(bool((timesteps == timesteps[:, :1]).all()))
        self.assertEqual(trained["hidden_states"].shape[1:], given[0]["hidden_states"].shape[1:])


class WanExpertMemoryPlanTest(unittest.TestCase):
    def test_plan_holds_the_frozen_expert_beside_the_trained_one(self):
        """Wan2.2-T2V-A14B's experts have Wan 2.1 14B's architecture (Comfy-Org's
        wan2.2_t2v_high_noise_14B_fp16.safetensors is 28.6 GB, as Wan 2.1 14B's)."""
        with tempfile.TemporaryDirectory(prefix="st-wan22-plan-") as tmp:
            root = Path(tmp)
            folder = root / "wan22-a14b"
            for subfolder, config in {"transformer": transformer_config("14b"),
                                      "transformer_2": transformer_config("14b"),
                                      **SHARED_CONFIGS}.items():
                (folder / subfolder).mkdir(parents=True)
                (folder / subfolder / "config.json").write_text(json.dumps(config))
            (folder / "model_index.json").write_text(json.dumps(
                {"_class_name": "WanPipeline", "boundary_ratio": BOUNDARY}))
            make_shapes(root / "data", per_size=1, sizes=((64, 64),))
            config = write_config(root, root / "data", "a14b", model_family="wan",
                                  pretrained_model_name_or_path=str(folder),
                                  model_flavour="t2v-14b-2.2-low", mixed_precision="bf16")
            output = plan_in_process(config)
        bf16_expert = WAN_PARAMETERS["14b"] * 2 / GIB
        for moment in ("while the caches are built", "while training"):
            ddp, fsdp = row(output, "other networks (frozen)", after=moment)
            self.assertAlmostEqual(ddp / bf16_expert, 1, delta=0.01)
            self.assertEqual(fsdp, ddp)  # not sharded: every rank holds it whole
        ddp_gradients, _ = row(output, "gradients")  # one trained expert, float32
        self.assertAlmostEqual(ddp_gradients / (WAN_PARAMETERS["14b"] * 4 / GIB), 1, delta=0.01)


class Wan22ExpertTrainingTest(TrainingRuns, TrainedOutputAssertions, unittest.TestCase):
    """In this process: a LoRA run of the low-noise expert (4 steps) and a full run of the
    high-noise expert (2 steps)."""

    tmp_prefix = "st-wan22-"
    launch = staticmethod(run_in_process)
    options = dict(model_family="wan", pretrained_model_name_or_path="builtin:tiny-wan22")

    @classmethod
    def start_runs(cls):
        make_shapes(cls.root / "data", per_size=2, sizes=((64, 64),))
        cls.train("lora", model_flavour="t2v-14b-2.2-low", model_type="lora", lora_rank=4,
                  learning_rate=3e-2, max_train_steps=4)
        cls.train("full", model_flavour="t2v-14b-2.2-high", max_train_steps=2)

    def sample(self, pipeline) -> np.ndarray:
        pipeline.set_progress_bar_config(disable=True)
        frames = pipeline(prompt="a red circle", height=64, width=64, num_frames=5,
                          num_inference_steps=4, output_type="np",
                          generator=torch.Generator().manual_seed(0)).frames[0]
        self.assertEqual(frames.shape, (5, 64, 64, 3))
        return frames.astype(np.float64)

    def test_the_low_expert_lora_loads_into_transformer_2_and_changes_the_clip(self):
        pipeline = WanPipeline.from_pretrained(resolve_model_path("builtin:tiny-wan22"))
        before = self.sample(pipeline)
        pipeline.load_lora_weights(self.root / "lora-out" / "lora", load_into_transformer_2=True)
        self.assertTrue(any("lora" in name for name, _ in
                            pipeline.transformer_2.named_parameters()))
        self.assertFalse(any("lora" in name for name, _ in
                             pipeline.transformer.named_parameters()))
        self.assertGreater(np.abs(self.sample(pipeline) - before).mean(), 1e-4)

    def test_the_full_run_of_the_high_expert_exports_the_low_expert_as_loaded(self):
        out, base = self.root / "full-out", resolve_model_path("builtin:tiny-wan22")
        pipeline = DiffusionPipeline.from_pretrained(out / "pipeline")
        self.assertIsInstance(pipeline, WanPipeline)
        self.assertEqual(pipeline.config.boundary_ratio, BOUNDARY)
        self.assert_some_tensor_changed(base / "transformer" / EXPERT_WEIGHTS,
                                        out / TRANSFORMER_WEIGHTS)
        self.assert_same_tensors(base / "transformer_2" / EXPERT_WEIGHTS,
                                 out / "pipeline" / "transformer_2" / EXPERT_WEIGHTS)


if __name__ == "__main__":
    unittest.main()
