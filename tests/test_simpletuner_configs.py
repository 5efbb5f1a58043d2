"""A config a SimpleTuner user brings: unsupported options are named as such, with advice."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import typing
import unittest
from pathlib import Path
from unittest import mock

from simpletuner.configuration import ConfigError, DatasetConfig, TrainingConfig, load_configuration
from simpletuner.configuration.simpletuner_options import CONFIG_JSON, MULTIDATABACKEND_JSON

SIMPLETUNER_CONFIG = {
    "--model_family": "sdxl", "--model_type": "lora", "--peft_lora_mode": "singlora",
    "--model_flavour": "base", "--base_model_precision": "int8-quanto",
    "--quantize_via": "pipeline", "--optimizer": "adamw_schedulefree", "--report_to": "comet_ml",
    "--push_to_hub": True, "--lr_scheduler": "sine", "--mixed_precision": "bf16",
}
SIMPLETUNER_DATASET = {"caption_strategy": "csv", "probability": 1.0,
                       "crop_style": "face", "vae_cache_clear_each_epoch": True}


class SimpleTunerConfigTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.root = Path(self._tmp.name)
        (self.root / "images").mkdir()
        self.config_path = self.root / "config.json"
        self.backend_path = self.root / "multidatabackend.json"

    def load(self, options: dict, datasets: list):
        base = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                "output_dir": "out", "data_backend_config": str(self.backend_path)}
        self.config_path.write_text(json.dumps({**base, **options}))
        self.backend_path.write_text(json.dumps(datasets))
        return load_configuration(self.config_path, cwd=self.root)

    def problems(self, options: dict, datasets: list) -> list[str]:
        with self.assertRaises(ConfigError) as caught:
            self.load(options, datasets)
        return caught.exception.problems

    def image_dataset(self, **keys) -> dict:
        return {"id": "photos", "type": "local", "instance_data_dir": str(self.root / "images"),
                **keys}

    def test_each_unsupported_option_is_named_with_advice_and_no_suggestion(self):
        config = {k: v for k, v in SIMPLETUNER_CONFIG.items() if k != "--model_family"}
        problems = self.problems(config, [self.image_dataset(**SIMPLETUNER_DATASET)])
        expected = {"peft_lora_mode": "peft LoRA", "quantize_via": "on the CPU",
                    "push_to_hub": "nothing is uploaded",
                    "vae_cache_clear_each_epoch": "cached once and reused"}
        for key, advice in expected.items():
            found = [p for p in problems if f"SimpleTuner option '{key}' is not supported" in p]
            self.assertEqual(len(found), 1, (key, problems))
            self.assertIn(advice, found[0])
        values = {"optimizer": "adamw_schedulefree", "report_to": "comet_ml", "lr_scheduler": "sine",
                  "caption_strategy": "csv", "crop_style": "face"}
        for key, value in values.items():
            found = [p for p in problems if f"SimpleTuner's {key} '{value}' is not supported" in p]
            self.assertEqual(len(found), 1, (key, problems))
        self.assertEqual(len(problems), len(expected) + len(values), problems)
        self.assertFalse([p for p in problems if "did you mean" in p], problems)

    def test_real_typos_still_get_a_suggestion(self):
        problems = self.problems({"learning_rat": 1e-4, "lr_scheduler": "cosin"},
                                 [self.image_dataset()])
        self.assertIn("did you mean 'learning_rate'", problems[0])
        self.assertIn("did you mean 'cosine'", problems[1])

    def test_text_embeds_entry_sets_the_text_cache_folder(self):
        text_cache = str(self.root / "cache" / "text" / "sdxl")
        entries = [{"id": "text-embeds", "dataset_type": "text_embeds", "default": True,
                    "type": "local", "cache_dir": text_cache, "write_batch_size": 128},
                   {"id": "image-embeds", "dataset_type": "image_embeds", "type": "local"},
                   self.image_dataset(image_embeds="image-embeds"),
                   self.image_dataset(id="own", cache_dir="elsewhere")]
        config = self.load({}, entries)
        self.assertEqual([d.id for d in config.datasets], ["photos", "own"])
        self.assertEqual([d.cache_dir for d in config.datasets], [text_cache, "elsewhere"])

    def test_embed_entry_mistakes_say_why(self):
        problems = self.problems({}, [
            {"id": "text", "dataset_type": "text_embeds"},
            {"id": "img", "dataset_type": "image_embeds", "cache_dir": "x"},
            self.image_dataset(text_embeds="missing")])
        text = "\n".join(problems)
        self.assertEqual(len(problems), 3, text)
        self.assertIn("'cache_dir' is required on a text_embeds entry", text)
        self.assertIn("set cache_dir_vae on the image datasets", text)
        self.assertIn("'text_embeds' names 'missing', which is no enabled text_embeds entry", text)

    def test_a_different_meaning_is_said_when_the_value_is_rejected(self):
        problems = self.problems({"noise_offset": -0.1}, [self.image_dataset()])
        self.assertEqual(len(problems), 1)
        self.assertIn("differs from SimpleTuner", problems[0])
        self.assertIn("offset_noise", problems[0])

    def test_quoted_values_are_read_as_simpletuner_reads_them_and_its_zero_means_not_set(self):
        # SimpleTuner passes config.json's values as command-line text: its files quote them.
        config = self.load({"learning_rate": "1e-4", "use_ema": "True", "train_batch_size": "3",
                            "max_grad_norm": " 0.5 "}, [self.image_dataset()])
        training = config.training
        self.assertEqual((training.learning_rate, training.use_ema, training.train_batch_size,
                          training.max_grad_norm), (0.0001, True, 3, 0.5))
        problems = self.problems({"train_batch_size": "2.5", "use_ema": "yes"},
                                 [self.image_dataset()])
        self.assertEqual(len(problems), 2, problems)  # quoted, but still not an integer / bool
        self.assertIn("key 'train_batch_size' is '2.5'", problems[0] + problems[1])
        config = self.load({"num_train_epochs": 0, "max_train_steps": 7}, [self.image_dataset()])
        self.assertIsNone(config.training.num_train_epochs)
        self.assertEqual(config.training.max_train_steps, 7)

    def test_config_wide_image_sizes_are_the_datasets_defaults(self):
        config = self.load({"minimum_image_size": 0, "maximum_image_size": 1024,
                            "target_downsample_size": 768},
                           [self.image_dataset(), self.image_dataset(id="own",
                                                                     minimum_image_size=256)])
        own = {d.id: (d.minimum_image_size, d.maximum_image_size, d.target_downsample_size)
               for d in config.datasets}
        self.assertEqual(own, {"photos": (0, 1024, 768), "own": (256, 1024, 768)})

    def test_simpletuners_names_and_values_of_the_same_option(self):
        training = self.load({"checkpoint_step_interval": 25, "validation_step_interval": 50,
                              "optimizer": "torch-adamw", "optimizer_beta2": 0.99,
                              "use_gradient_checkpointing": True},
                             [self.image_dataset()]).training
        self.assertEqual((training.checkpointing_steps, training.validation_steps), (25, 50))
        self.assertEqual((training.optimizer, training.adam_beta2), ("adamw", 0.99))
        self.assertTrue(training.gradient_checkpointing)
        problems = self.problems({"checkpoint_step_interval": 25, "checkpointing_steps": 5},
                                 [self.image_dataset()])
        self.assertIn("given twice ('checkpoint_step_interval' and 'checkpointing_steps') with "
                      "different values (25 and 5)", problems[0])
        # Both names with the same value, as SimpleTuner's own examples write them: one option.
        training = self.load({"validation_steps": 50, "validation_step_interval": 50},
                             [self.image_dataset()]).training
        self.assertEqual(training.validation_steps, 50)
        # instance_data_root: the older name SimpleTuner's factory still reads
        (dataset,) = self.load({}, [{"id": "photos", "instance_data_root": str(
            self.root / "images")}]).datasets
        self.assertEqual(dataset.instance_data_dir, str(self.root / "images"))

    def test_values_of_simpletuners_examples_that_ask_for_nothing_here(self):
        """init_lora_step 0 (a fresh start), vae_cache_ondemand (the same latents, cached), a
        component path naming the model folder itself: accepted; other values still refused."""
        ondemand = self.image_dataset(vae_cache_ondemand=True)
        self.load({"init_lora_step": 0, "vae_cache_ondemand": True,
                   "pretrained_t5_model_name_or_path": "builtin:tiny-sd1x"}, [ondemand])
        problems = self.problems({"init_lora_step": 5,
                                  "pretrained_t5_model_name_or_path": "google/t5-v1_1-xxl"},
                                 [self.image_dataset()])
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("SimpleTuner option 'init_lora_step' is not supported here (accepted as "
                      "null or 0)", problems[0])
        self.assertIn("'pretrained_t5_model_name_or_path' is not supported here", problems[1])

    def test_flux_lora_target_names_the_modules_of_simpletuners_sets(self):
        flux = {"model_family": "flux", "pretrained_model_name_or_path": "builtin:tiny-flux",
                "model_type": "lora"}
        training = self.load({**flux, "flux_lora_target": "all+ffs"}, [self.image_dataset()]
                             ).training
        self.assertEqual(training.lora_target_modules, [
            "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
            "to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
            "ff_context.net.2", "proj_mlp", "proj_out"])
        training = self.load({**flux, "flux_lora_target": "context",  # SimpleTuner's order
                              "peft_lora_target_modules": ["to_q"]}, [self.image_dataset()]
                             ).training
        self.assertEqual(training.lora_target_modules, ["to_q"])
        for options in ({**flux, "flux_lora_target": "controlnet"},
                        {"model_type": "lora", "flux_lora_target": "all+ffs"}):  # sd1x
            with self.subTest(options=options):
                (problem,) = self.problems(options, [self.image_dataset()])
                self.assertIn("SimpleTuner option 'flux_lora_target' is not supported here",
                              problem)
                self.assertIn("model_family 'flux' reads mmdit, all, context", problem)

    def test_every_flux_lora_target_set_names_modules_flux_has(self):
        """Each set adapts modules of FluxTransformer2DModel (tiny and nano name blocks 7 and
        20 of the full model's 38 single blocks, which the tiny model does not have)."""
        from diffusers import FluxTransformer2DModel

        from simpletuner.families.flux.spec import LORA_TARGET_PRESETS
        from simpletuner.models.builtin import ensure_builtin_model
        from simpletuner.training.adapters.lora import check_target_modules

        folder = ensure_builtin_model("tiny-flux") / "transformer"
        network = FluxTransformer2DModel.from_config(FluxTransformer2DModel.load_config(folder))
        for name, modules in LORA_TARGET_PRESETS.items():
            if name not in ("tiny", "nano"):
                with self.subTest(preset=name):
                    check_target_modules(network, list(modules), "flux")  # raises if absent
        self.assertTrue(all(module.startswith("single_transformer_blocks.")
                            for name in ("tiny", "nano") for module in LORA_TARGET_PRESETS[name]))

    def test_simpletuners_placeholders_in_dataset_paths(self):
        with mock.patch.dict(os.environ, {"ST_TEST_ROOT": "/data"}):
            config = self.load({}, [
                self.image_dataset(cache_dir_vae="cache/vae/{model_family}/{id}",
                                   instance_prompt="{unknown} stays"),
                {"id": "text", "dataset_type": "text_embeds", "default": True,
                 "cache_dir": "{env:ST_TEST_ROOT}/text/{model_family}"}])
        (dataset,) = config.datasets
        self.assertEqual(dataset.cache_dir_vae, "cache/vae/sd1x/photos")
        self.assertEqual(dataset.cache_dir, "/data/text/sd1x")
        self.assertEqual(dataset.instance_prompt, "{unknown} stays")
        config = self.load({}, [self.image_dataset(cache_dir_vae="{output_dir}/vae")])
        self.assertEqual(config.datasets[0].cache_dir_vae, str(self.root / "out" / "vae"))

    def test_eval_interval_needs_an_eval_dataset(self):
        problems = self.problems({"eval_steps_interval": 10}, [self.image_dataset()])
        self.assertEqual(len(problems), 1)
        self.assertIn("'eval_steps_interval' needs a dataset with 'dataset_type': 'eval'",
                      problems[0])

    def test_tables_never_shadow_a_supported_option(self):
        for cls, vocabulary in ((TrainingConfig, CONFIG_JSON),
                                (DatasetConfig, MULTIDATABACKEND_JSON)):
            fields = {f.name for f in dataclasses.fields(cls)}
            self.assertFalse(fields & set(vocabulary.unsupported_keys), cls.__name__)
            self.assertLessEqual(set(vocabulary.unsupported_values) | set(
                vocabulary.different_meaning), fields, cls.__name__)
            hints = typing.get_type_hints(cls)
            for key, values in vocabulary.unsupported_values.items():
                self.assertFalse(set(values) & _literal_values(hints[key]), key)


def _literal_values(tp) -> set:
    if typing.get_origin(tp) is typing.Literal:
        return set(typing.get_args(tp))
    return {v for arg in typing.get_args(tp) for v in _literal_values(arg)}


if __name__ == "__main__":
    unittest.main()
