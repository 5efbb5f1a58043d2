"""The exported model's README.md is a model card huggingface_hub reads."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from diffusers import StableDiffusionPipeline
from huggingface_hub import ModelCard

from simpletuner.configuration import TrainingConfig
from simpletuner.models.builtin import resolve_model_path
from simpletuner.training.reporting.model_card import write_model_card

SUMMARY = {"steps": 12, "seed": 7, "final_loss": 0.125, "processes": 2}


def training(**options) -> TrainingConfig:
    settings = {"model_family": "sdxl", "pretrained_model_name_or_path": "/models/sdxl",
                "output_dir": "out", "data_backend_config": "d.json",
                "validation_prompt": ["a red fox: \"quoted\" # not a comment"], **options}
    return TrainingConfig(**settings)


class ModelCardTest(unittest.TestCase):
    def load(self, config: TrainingConfig, base_folder: Path = Path("/models/sdxl")
             ) -> ModelCard:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_model_card(Path(tmp), config, SUMMARY, ["portraits"], base_folder)
            return ModelCard.load(path)

    def test_full_fine_tune_card_parses_with_its_metadata(self):
        card = self.load(training())
        self.assertEqual(card.data.library_name, "diffusers")
        self.assertEqual(card.data.pipeline_tag, "text-to-image")
        self.assertEqual(card.data.base_model, "/models/sdxl")
        self.assertIn("full", card.data.tags)
        self.assertIn("| steps | 12 |", card.text)
        self.assertIn('- a red fox: "quoted" # not a comment', card.text)
        self.assertIn('DiffusionPipeline.from_pretrained("pipeline")', card.text)

    def test_lora_card_says_how_to_load_the_adapter(self):
        card = self.load(training(model_type="lora", lora_rank=8))
        self.assertIn("lora", card.data.tags)
        self.assertIn('pipeline.load_lora_weights("lora")', card.text)
        self.assertIn("| LoRA rank / alpha | 8 / 8 |", card.text)

    def test_a_built_in_base_is_loaded_from_its_folder_by_the_snippet(self):
        folder = resolve_model_path("builtin:tiny-sd1x")
        card = self.load(training(model_family="sd1x", model_type="lora", lora_rank=4,
                                  pretrained_model_name_or_path="builtin:tiny-sd1x"), folder)
        snippet = card.text.split("```python\n", 1)[1].split("```", 1)[0]
        self.assertNotIn('from_pretrained("builtin:', snippet)
        base_lines = [line for line in snippet.splitlines() if "load_lora_weights" not in line]
        scope: dict = {}
        exec("\n".join(base_lines), scope)  # the card's own lines load the base model
        self.assertIsInstance(scope["pipeline"], StableDiffusionPipeline)


if __name__ == "__main__":
    unittest.main()
