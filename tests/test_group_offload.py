"""Group offload (enable_group_offload): with the VAE and text encoders under diffusers' hooks,
text embeddings, latents and a validation image are the same as without; the hooks are in
diffusers' registry on the VAE and each text encoder, not on the trained network; nothing moves
them with .to(); a full export of disk-offloaded encoders holds their real weights.

The CPU is the onload device here, so the text encoders go to disk: between forwards their
tensors are then empty placeholders, and a layer whose group was not brought back computes
with them and changes the result (T5's tied embedding did, before untie_shared_parameters)."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

import numpy as np
import torch
from diffusers.hooks import HookRegistry
from PIL import Image
from safetensors.torch import load_file

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.models.builtin import ensure_builtin_model
from simpletuner.models.group_offload import offload_groups, saved_weights_in_place
from simpletuner.models.pipelines import export_pipeline
from simpletuner.training.memory.group_offload import offload_frozen_components, rank_folder
from simpletuner.training.memory.model import memory_plan
from simpletuner.training.memory.offload import release_frozen_components
from simpletuner.training.reporting.validation import run_validation
from simpletuner.training.settings import GroupOffloadSettings, OffloadSettings

from model_fixtures import CPU, TinyModelCase
from settings_fixtures import settings, training_config
from test_frozen_offload import validation_settings
from training_fixtures import check_recording_torch, write_config

PROMPTS = ["a red circle", "a blue square"]


def group_hooked(module: torch.nn.Module) -> bool:
    """A group-offloading hook in diffusers' registry on ``module`` or one of its modules."""
    return any(isinstance(getattr(m, "_diffusers_hook", None), HookRegistry)
               and m._diffusers_hook.get_hook("group_offloading") is not None
               for m in module.modules())


def pixels(count: int) -> torch.Tensor:
    """``count`` seeded random 64 x 64 images in [-1, 1]."""
    return torch.rand(count, 3, 64, 64, generator=torch.Generator().manual_seed(7)) * 2 - 1


def same(expected, actual) -> bool:
    return expected.keys() == actual.keys() and all(
        torch.equal(expected[k], actual[k]) for k in expected)


class GroupOffloadFluxTest(TinyModelCase):
    """Flux: CLIP and T5 (tied embedding) text encoders, a diffusers VAE."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        cls.reference = cls.load(cls, "flux")
        cls.pixels = pixels(2)
        with torch.no_grad():
            cls.embeds = cls.reference.encode_prompts(PROMPTS)
            cls.latents = cls.reference.encode_for_cache(cls.pixels)
        cls.image = cls.validation_image(cls, cls.reference, "reference")

    def validation_image(self, adapter, name: str) -> np.ndarray:
        paths = run_validation(adapter, validation_settings(self.tmp / name), step=1)
        return np.asarray(Image.open(paths[0]))

    def offloaded(self, kind: str, name: str):
        adapter = self.load("flux")
        self.settings = settings(GroupOffloadSettings, enable_group_offload=True,
                                 group_offload_type=kind, output_dir=str(self.tmp / name),
                                 group_offload_to_disk_path=str(self.tmp / f"{name}-disk"))
        hooked = offload_frozen_components(adapter, self.settings, CPU, rank=0)
        self.assertEqual(hooked, ["vae", "text_encoder", "text_encoder_2"])
        return adapter

    def test_block_level_caches_and_validates_the_same(self):
        adapter = self.offloaded("block_level", "block")
        self.assertTrue(all(map(group_hooked, [adapter.vae, *adapter.text_encoders])))
        self.assertFalse(group_hooked(adapter.trainable))
        with torch.no_grad():
            self.assertTrue(same(self.embeds, adapter.encode_prompts(PROMPTS)))
            self.assertTrue(torch.equal(self.latents, adapter.encode_for_cache(self.pixels)))
        np.testing.assert_array_equal(self.validation_image(adapter, "block"), self.image)
        folders = sorted(p.name for p in rank_folder(self.settings, 0).iterdir())
        self.assertEqual(folders, ["text_encoder", "text_encoder_2"])  # the VAE stays in memory

    def test_leaf_level_gives_the_same_embeddings(self):
        adapter = self.offloaded("leaf_level", "leaf")
        with torch.no_grad():
            self.assertTrue(same(self.embeds, adapter.encode_prompts(PROMPTS)))

    def test_nothing_moves_them_and_they_stay_through_release(self):
        adapter = self.offloaded("block_level", "moves")
        release_frozen_components(adapter, settings(
            OffloadSettings, frozen_components_after_caching="offload"), torch.float32)
        self.assertIsNone(adapter.frozen_away)
        adapter.move_to(torch.device("meta"))
        self.assertTrue(adapter.transformer.proj_out.weight.is_meta)
        for module in (adapter.vae, *adapter.text_encoders):
            self.assertFalse(any(p.is_meta for p in module.parameters()))
            self.assertTrue(group_hooked(module))

    def test_a_full_export_holds_the_real_encoder_weights(self):
        adapter = self.offloaded("block_level", "export")
        frozen = [adapter.vae, *adapter.text_encoders]
        with saved_weights_in_place(frozen):
            folder = export_pipeline(adapter.build_pipeline(), self.tmp / "export-out")
        exported = load_file(str(next((folder / "text_encoder_2").glob("*.safetensors"))))
        expected = self.reference.text_encoders[1].state_dict()
        self.assertTrue(all(torch.equal(expected[k], v) for k, v in exported.items()))
        with torch.no_grad():  # placeholders again, and still brought back for each forward
            self.assertTrue(same(self.embeds, adapter.encode_prompts(PROMPTS)))

    def test_plan_counts_one_component_while_caching_and_none_while_training(self):
        """float32 here, so each component's bytes are its loaded tensors' bytes."""
        loaded = [sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
                  for m in (self.reference.vae, *self.reference.text_encoders)]

        def held(**options):
            training = training_config(model_family="flux", model_type="lora",
                                       pretrained_model_name_or_path="builtin:tiny-flux",
                                       frozen_components_after_caching="keep", **options)
            return memory_plan(training, ensure_builtin_model("tiny-flux"), world=1).ddp

        plain, block = held(), held(enable_group_offload=True)
        leaf = held(enable_group_offload=True, group_offload_type="leaf_level")
        self.assertEqual(sum(plain.frozen_components.values()), sum(loaded))
        self.assertEqual(sum(block.frozen_components.values()), max(loaded))  # T5, whole
        self.assertEqual(leaf.frozen_components, {})
        self.assertEqual(plain.while_training - block.while_training, sum(loaded))
        self.assertEqual(block.while_caching, plain.while_caching - sum(loaded) + max(loaded))


class GroupOffloadQwenImageTest(TinyModelCase):
    """Qwen-Image: a Qwen2.5-VL encoder, and a VAE without diffusers' own block list, entered
    through encode() and decode(), on disk here so a part never brought back would show."""

    def test_encoder_and_vae_give_the_same_results(self):
        reference, adapter = self.load("qwen_image"), self.load("qwen_image")
        images = pixels(2)[:, :, None]  # one-frame clips
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))

        def results(model):
            with torch.no_grad():
                latents = model.vae.encode(images).latent_dist.mode()
                return model.encode_prompts(PROMPTS), latents, model.vae.decode(latents).sample

        expected = results(reference)
        for index, module in enumerate([adapter.vae, *adapter.text_encoders]):
            offload_groups(module, onload_device=CPU, offload_type="block_level",
                           blocks_per_group=1, use_stream=False, disk_folder=tmp / str(index))
        embeds, latents, decoded = results(adapter)
        self.assertTrue(same(expected[0], embeds))
        self.assertTrue(torch.equal(expected[1], latents))
        self.assertTrue(torch.equal(expected[2], decoded))


class GroupOffloadConfigTest(unittest.TestCase):
    """Bad group offload options are configuration errors, named by key, before launch."""

    @classmethod
    def setUpClass(cls):
        cls.root = Path(cls.enterClassContext(tempfile.TemporaryDirectory()))
        (cls.root / "data").mkdir()

    def problems(self, name: str, **options) -> str:
        config = write_config(self.root, self.root / "data", name, enable_group_offload=True,
                              **options)
        with self.assertRaises(ConfigError) as raised:
            load_configuration(config)
        return str(raised.exception)

    def test_an_unknown_type_lists_the_known_ones(self):
        message = self.problems("type", group_offload_type="block")
        self.assertIn("'group_offload_type'", message)
        self.assertIn("'block_level', 'leaf_level'", message)

    def test_freeing_the_components_it_holds_is_refused(self):
        message = self.problems("free", frozen_components_after_caching="free")
        self.assertIn("'frozen_components_after_caching' is 'free'", message)

    def test_quantized_encoders_that_cannot_be_offloaded_or_written_are_refused(self):
        message = self.problems("quantized", text_encoder_1_precision="int8-quanto",
                                text_encoder_2_precision="int8-torchao",
                                group_offload_to_disk_path=str(self.root / "offload"))
        self.assertIn("'text_encoder_1_precision' is 'int8-quanto'", message)
        self.assertIn("'text_encoder_2_precision' is 'int8-torchao': a quantized", message)

    def test_a_disk_path_that_cannot_be_written_stops_check_before_launch(self):
        blocker = self.root / "a-file"
        blocker.write_text("not a folder")
        config = write_config(self.root, self.root / "data", "disk", enable_group_offload=True,
                              group_offload_to_disk_path=str(blocker / "offload"))
        with self.assertRaises(ConfigError) as raised:
            load_configuration(config)
        self.assertIn(f"'group_offload_to_disk_path' ({blocker / 'offload'}) cannot be created: "
                      f"{blocker} is a file", str(raised.exception))
        result = check_recording_torch(config, self.root)  # what ./train.sh runs first
        self.assertEqual(result.stdout.split()[-2:], ["False", "2"], result.stderr[-2000:])


if __name__ == "__main__":
    unittest.main()
