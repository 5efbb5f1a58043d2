"""FLUX.2 (model_family flux2): the adapter feeds the transformer what Flux2KleinPipeline and
Flux2Pipeline feed it and learns; builtin:tiny-flux2 picks klein's layout; plan --memory counts
the published sizes; config mistakes are named before anything loads. Training, resume and
export: the conformance suite (tests/conformance.py)."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

import torch
from diffusers import (AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Pipeline,
                       Flux2Transformer2DModel)

from model_fixtures import (CPU, TinyModelCase, losses_around_training, network_prediction,
                            random_batch)
from simpletuner.cli import main
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.base import LossSettings
from simpletuner.models.layout import ModelFolderError
from simpletuner.models.training_batch import TrainingBatch
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.families.flux2.adapter import Flux2Adapter, Flux2KleinAdapter
from simpletuner.models.layout import check_model_folder
from simpletuner.models.registry import get_adapter_class
from simpletuner.models.tiny.tokenizers import write_tiny_qwen2_tokenizer
from simpletuner.training.memory.sharding import repeated_blocks
from test_memory_plan_command import GIB, row
from training_fixtures import make_shapes, write_config

PROMPTS = ["a red circle", "a blue square"]
MISTRAL_TEMPLATE = (  # Mistral's layout of a system and a user message
    "{% for m in messages %}{% if m['role'] == 'system' %}[SYSTEM_PROMPT]"
    "{{ m['content'][0]['text'] }}[/SYSTEM_PROMPT]{% else %}[INST]"
    "{{ m['content'][0]['text'] }}[/INST]{% endif %}{% endfor %}")


def capture_call(module: torch.nn.Module, run) -> dict:
    """The keyword arguments of ``module``'s first call while ``run()`` runs."""
    calls = []
    handle = module.register_forward_pre_hook(lambda _m, _a, kwargs: calls.append(kwargs),
                                              with_kwargs=True)
    try:
        run()
    finally:
        handle.remove()
    return calls[0]


def echo_network(seen: dict):
    """A stand-in transformer that records its inputs and returns its image tokens."""
    def network(**inputs):
        seen.update(inputs)
        return (inputs["hidden_states"],)
    return network


class Flux2Case(TinyModelCase):
    def assert_same_inputs(self, adapter, pipeline, embeds: torch.Tensor, **call):
        """One denoising step of ``pipeline`` from fixed latents and the adapter's _predict at
        that step's sigma give the transformer identical inputs; the prediction is unpacked
        back to the latents' layout."""
        latents = torch.randn(1, adapter.transformer.config.in_channels, 4, 3,
                              generator=torch.Generator().manual_seed(3))
        reference = capture_call(adapter.transformer, lambda: pipeline(
            prompt_embeds=embeds, latents=latents, height=64, width=48, num_inference_steps=1,
            output_type="latent", **call))
        ours = {}
        batch = TrainingBatch(latents, {"prompt_embeds": embeds}, [], [], [])
        prediction = adapter._predict(echo_network(ours), latents, reference["timestep"], batch,
                                      torch.float32)
        self.assertTrue(torch.equal(prediction, latents))  # unpacking inverts the packing
        self.assertEqual(ours["guidance"] is None, reference["guidance"] is None)
        for name in ("hidden_states", "timestep", "encoder_hidden_states", "txt_ids",
                     "img_ids", "guidance"):
            if reference[name] is not None:
                self.assertTrue(torch.equal(ours[name], reference[name]), name)
        return reference


class Flux2AdapterTest(Flux2Case):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.folder = ensure_builtin_model("tiny-flux2")
        cls.adapter = get_adapter_class("flux2").load(
            cls.folder, device=CPU, weight_dtype=torch.float32, loss_settings=LossSettings())
        cls.pipeline = cls.adapter.build_pipeline()
        cls.pipeline.set_progress_bar_config(disable=True)

    def test_the_folder_picks_the_klein_layout(self):
        self.assertIsInstance(self.adapter, Flux2KleinAdapter)
        self.assertIsInstance(self.pipeline, Flux2KleinPipeline)
        self.assertEqual(self.adapter.resolution_alignment, 16)  # 8x VAE, then 2x2 patches

    def test_fsdp2_shards_every_double_and_single_stream_block(self):
        names = [type(block).__name__ for block in repeated_blocks(self.adapter.transformer)]
        self.assertEqual((names.count("Flux2TransformerBlock"),
                          names.count("Flux2SingleTransformerBlock")), (1, 1))

    def test_prompts_are_the_pipelines_encode_prompt(self):
        embeds, _ = self.pipeline.encode_prompt(PROMPTS, device=CPU)
        ours = self.adapter.encode_prompts(PROMPTS)["prompt_embeds"]
        self.assertEqual(tuple(ours.shape), (2, 512, 3 * 16))  # layers 9, 18, 27 side by side
        self.assertTrue(torch.equal(ours, embeds))

    def test_latents_are_the_pipelines_normalised_patchified_latents(self):
        pixels = torch.rand(2, 3, 64, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
        ours = self.adapter.encode_images(pixels)
        self.assertEqual(tuple(ours.shape), (2, 32, 4, 2))
        self.assertTrue(torch.allclose(ours, self.pipeline._encode_vae_image(pixels, None)))
        vae = self.adapter.vae  # the tiny VAE's statistics are not (0, 1): really normalised
        raw = Flux2Pipeline._patchify_latents(vae.encode(pixels).latent_dist.mode())
        self.assertGreater((ours - raw).abs().max().item(), 1e-3)

    def test_the_transformer_gets_what_the_klein_pipeline_gives_it(self):
        embeds, _ = self.pipeline.encode_prompt(PROMPTS[:1], device=CPU)
        seen = self.assert_same_inputs(self.adapter, self.pipeline, embeds, guidance_scale=1.0)
        self.assertIsNone(seen["guidance"])  # klein has no guidance input

    def test_loss_is_the_velocity_error_at_sigma(self):
        batch = random_batch(self.adapter, 2, 64, 48)
        seen = {}
        loss = self.adapter.compute_loss(batch, torch.Generator().manual_seed(5),
                                         network=echo_network(seen))
        clean = Flux2Pipeline._pack_latents(batch.latents)
        sigma = seen["timestep"].view(-1, 1, 1)
        noise = (seen["hidden_states"] - (1 - sigma) * clean) / sigma
        self.assertAlmostEqual(noise.std().item(), 1.0, delta=0.15)  # it really is noise
        # The echo predicts the noisy input: loss = mean((noisy - (noise - clean))^2).
        expected = (seen["hidden_states"] - (noise - clean)).pow(2).mean().item()
        self.assertAlmostEqual(loss.item(), expected, places=4)

    def test_two_references_follow_the_image_in_order_and_change_its_prediction(self):
        embeds, _ = self.pipeline.encode_prompt(PROMPTS[:1], device=CPU)
        latents = torch.randn(1, self.adapter.transformer.config.in_channels, 4, 3,
                              generator=torch.Generator().manual_seed(3))
        first, second = (torch.randn(1, latents.shape[1], h, w,
                                     generator=torch.Generator().manual_seed(seed))
                         for seed, (h, w) in ((4, (2, 2)), (5, (3, 2))))
        seen = {}
        batch = TrainingBatch(latents, {"prompt_embeds": embeds}, [], [], [],
                              reference_latents=(first, second))
        sigma = torch.tensor([0.5])
        prediction = self.adapter._predict(echo_network(seen), latents, sigma, batch,
                                           torch.float32)
        self.assertTrue(torch.equal(prediction, latents))  # the image's own tokens, unpacked
        tokens = seen["hidden_states"][0]
        self.assertEqual(tokens.shape[0], 12 + 4 + 6)
        self.assertTrue(torch.equal(tokens[12:16], first[0].flatten(1).T))
        self.assertTrue(torch.equal(tokens[16:], second[0].flatten(1).T))
        times = seen["img_ids"][0, :, 0].tolist()
        self.assertEqual(times, [0] * 12 + [10] * 4 + [20] * 6)  # Flux2Pipeline's time ids
        swapped = TrainingBatch(latents, {"prompt_embeds": embeds}, [], [], [],
                                reference_latents=(first.flip(-1), second))
        self.assertGreater((network_prediction(self.adapter, batch)
                            - network_prediction(self.adapter, swapped)).abs().max().item(), 1e-5)

    def test_loss_on_a_fixed_batch_falls(self):
        adapter = self.adapter  # the other tests hold for any transformer weights
        batch = random_batch(adapter, 2)
        # The chat-templated prompts' first 64 tokens: the rest is padding, and all 512 tokens
        # make a CPU step twenty times slower.
        batch.prompt_embeds = {"prompt_embeds": batch.prompt_embeds["prompt_embeds"][:, :64]}
        before, after = losses_around_training(adapter, batch, lr=3e-3, steps=20)
        self.assertLess(after, 0.75 * before, f"{before} -> {after}")


class Flux2DevLayoutTest(Flux2Case):
    """dev's layout without its text encoder (a PixtralProcessor needs torchvision): the
    guidance-distilled transformer gets flux_guidance_value as Flux2Pipeline's guidance."""

    def test_the_transformer_gets_what_flux2pipeline_gives_it(self):
        klein = get_adapter_class("flux2").load(
            ensure_builtin_model("tiny-flux2"), device=CPU, weight_dtype=torch.float32,
            loss_settings=LossSettings())
        torch.manual_seed(0)
        config = dict(klein.transformer.config) | {"guidance_embeds": True}
        transformer = Flux2Transformer2DModel.from_config(config)
        dev = Flux2Adapter(folder=klein.folder, vae=klein.vae, text_encoders=[], tokenizers=[],
                           device=CPU, loss_settings=LossSettings(flux_guidance_value=3.5),
                           transformer=transformer, scheduler=klein.scheduler)
        pipeline = Flux2Pipeline(scheduler=klein.scheduler, vae=klein.vae, text_encoder=None,
                                 tokenizer=None, transformer=transformer)
        pipeline.set_progress_bar_config(disable=True)
        embeds = klein.encode_prompts(PROMPTS[:1])["prompt_embeds"]
        seen = self.assert_same_inputs(dev, pipeline, embeds, guidance_scale=3.5)
        self.assertEqual(seen["guidance"].tolist(), [3.5])

    def test_dev_prompts_are_flux2pipelines_encode_prompt(self):
        """With a stand-in for the PixtralProcessor (it needs torchvision): a byte-level
        tokenizer with a Mistral-style chat template, all the pipeline's helper asks of it."""
        from transformers import Mistral3Config, Mistral3ForConditionalGeneration, Qwen2Tokenizer

        folder = Path(self.enterContext(tempfile.TemporaryDirectory()))
        vocab = write_tiny_qwen2_tokenizer(folder, 512)["vocab_size"]
        tokenizer = Qwen2Tokenizer.from_pretrained(folder)
        tokenizer.chat_template = MISTRAL_TEMPLATE
        torch.manual_seed(0)
        encoder = Mistral3ForConditionalGeneration(Mistral3Config(
            text_config=dict(model_type="mistral", hidden_size=16, intermediate_size=32,
                             num_hidden_layers=30, num_attention_heads=2, head_dim=8,
                             num_key_value_heads=1, vocab_size=vocab),
            vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32,
                               num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                               image_size=16, patch_size=4))).eval()
        dev = Flux2Adapter(folder=folder, vae=None, text_encoders=[encoder],
                           tokenizers=[tokenizer], device=CPU, loss_settings=LossSettings(),
                           transformer=None, scheduler=None)
        pipeline = Flux2Pipeline(scheduler=None, vae=None, text_encoder=encoder,
                                 tokenizer=tokenizer, transformer=None)
        expected, _ = pipeline.encode_prompt(PROMPTS, device=CPU)
        ours = dev.encode_prompts(PROMPTS)["prompt_embeds"]
        self.assertEqual(tuple(ours.shape), (2, 512, 3 * 16))  # layers 10, 20, 30
        self.assertTrue(torch.equal(ours, expected))

    @unittest.skipIf(importlib.util.find_spec("torchvision"), "torchvision is installed")
    def test_a_dev_folder_without_torchvision_is_refused_before_loading(self):
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        (root / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
        with self.assertRaises(ModelFolderError) as caught:
            get_adapter_class("flux2").load(root, device=CPU, weight_dtype=torch.float32,
                                            loss_settings=LossSettings())
        self.assertIn("PixtralProcessor, which transformers imports only with torchvision",
                      str(caught.exception))

    def test_model_index_chooses_the_layout(self):
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        for name, expected in (("Flux2Pipeline", Flux2Adapter),
                               ("Flux2KleinPipeline", Flux2KleinAdapter)):
            (root / "model_index.json").write_text(json.dumps({"_class_name": name}))
            self.assertIs(Flux2Adapter.for_folder(root), expected)
            self.assertIsNone(Flux2Adapter.flavour_problem(
                root, "dev" if expected is Flux2Adapter else "klein-9b"))
        problem = Flux2Adapter.flavour_problem(root, "dev")
        self.assertIn("'dev' is a Flux2Pipeline model", problem)
        self.assertIn("names Flux2KleinPipeline", problem)
        self.assertIn("not a FLUX.2 flavour", Flux2Adapter.flavour_problem(root, "schnell"))

    def test_flux_and_flux2_folders_are_told_apart(self):
        root = Path(self.enterContext(tempfile.TemporaryDirectory()))
        for name in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer"):
            (root / name).mkdir()
        (root / "model_index.json").write_text(json.dumps({"_class_name": "Flux2KleinPipeline"}))
        with self.assertRaises(ModelFolderError) as caught:
            check_model_folder(root, "flux", get_adapter_class("flux").required_subfolders())
        self.assertIn("says it is flux2", str(caught.exception))
        (root / "text_encoder_2").mkdir()
        (root / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
        with self.assertRaises(ModelFolderError) as caught:
            check_model_folder(root, "flux2", Flux2Adapter.required_subfolders(),
                               Flux2Adapter.forbidden_subfolders)
        self.assertIn("says it is flux:", str(caught.exception))


# Published configs and parameter counts of FLUX.2-dev and FLUX.2-klein-4B/-9B (sources in the
# file). The plan counts 32.22 B, 3.88 B and 9.08 B transformer parameters.
PUBLISHED = json.loads((Path(__file__).parent / "fixtures" / "flux2_published_configs.json")
                       .read_text(encoding="utf-8"))
FLAVOURS = ("dev", "klein-4b", "klein-9b")


def write_real_folder(root: Path, flavour: str) -> Path:
    folder = root / flavour
    published = PUBLISHED[flavour]
    for subfolder, config in {**published["configs"], "vae": PUBLISHED["vae"]}.items():
        (folder / subfolder).mkdir(parents=True, exist_ok=True)
        (folder / subfolder / "config.json").write_text(json.dumps(config))
    (folder / "model_index.json").write_text(json.dumps({"_class_name": published["pipeline"]}))
    return folder


class Flux2ConfigCase(TinyModelCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = cls.enterClassContext(tempfile.TemporaryDirectory(prefix="st-flux2-config-"))
        cls.root = Path(cls.tmp)
        make_shapes(cls.root / "data", per_size=1, sizes=((64, 64),))


class Flux2MemoryPlanTest(Flux2ConfigCase):

    def config(self, flavour: str, **options) -> Path:
        return write_config(self.root, self.root / "data", flavour, model_family="flux2",
                            pretrained_model_name_or_path=str(write_real_folder(
                                self.root, flavour)), mixed_precision="bf16",
                            model_flavour=flavour, **options)

    def test_plans_count_the_published_sizes_and_their_text_encoders(self):
        """plan --memory (the CLI in-process: no interpreter start-up) for every flavour."""
        with torch.device("meta"):
            vae = AutoencoderKLFlux2.from_config(PUBLISHED["vae"])
        vae_parameters = sum(p.numel() for p in vae.parameters())
        for flavour in FLAVOURS:
            published = PUBLISHED[flavour]
            with self.subTest(flavour=flavour):
                printed = io.StringIO()
                with redirect_stdout(printed):
                    status = main(["plan", "--memory", "--config", str(self.config(flavour)),
                                   "--num-processes", "8"])
                output = printed.getvalue()
                self.assertEqual(status, 0, output)
                count = re.search(r"trained network: ([0-9.]+) B parameters", output).group(1)
                self.assertEqual(round(float(count)), published["transformer_parameters"] / 1e9)
                # The frozen VAE and text encoder while caching, in bfloat16.
                frozen = row(output, "VAE + text encoders")[0] * GIB / 2 - vae_parameters
                self.assertAlmostEqual(frozen / published["text_encoder_parameters"], 1,
                                       delta=0.02)


class Flux2ConfigTest(Flux2ConfigCase):
    """Mistakes named before anything heavy: a flavour the folder contradicts (preflight), and
    SimpleTuner's intermediary-layer option, which would change what the pipeline encodes."""

    def problems(self, **options) -> str:
        from simpletuner.training.preflight import run_preflight

        config = write_config(self.root, self.root / "data", model_family="flux2",
                              pretrained_model_name_or_path="builtin:tiny-flux2", **options)
        try:
            run_preflight(load_configuration(config))
        except ConfigError as error:
            return str(error)
        return ""

    def test_a_flavour_the_folder_contradicts_is_named(self):
        self.assertEqual(self.problems(model_flavour="klein-4b", flux_guidance_value=2.0), "")
        problem = self.problems(model_flavour="dev")
        self.assertIn("key 'model_flavour': 'dev' is a Flux2Pipeline model", problem)
        self.assertIn("names Flux2KleinPipeline", problem)

    def test_intermediary_layers_are_refused_with_the_pipelines_layers(self):
        problem = self.problems(custom_text_encoder_intermediary_layers=[1, 2, 3])
        self.assertIn("custom_text_encoder_intermediary_layers", problem)
        self.assertIn("klein: 9, 18, 27", problem)

    def test_validation_options_the_pipelines_lack_are_refused(self):
        problem = self.problems(validation_negative_prompt="blurry",
                                validation_guidance_rescale=0.7)
        self.assertIn("'validation_negative_prompt': the FLUX.2 pipelines take no", problem)
        self.assertIn("the flux2 pipeline has no guidance rescale", problem)


if __name__ == "__main__":
    unittest.main()
