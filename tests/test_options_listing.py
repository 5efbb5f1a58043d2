"""`python -m simpletuner options` lists every option, and docs/OPTIONS.md is its current output."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import unittest
from pathlib import Path

from simpletuner.cli import main
from simpletuner.configuration import DatasetConfig, TrainingConfig
from simpletuner.configuration.embed_entries import EmbedCacheEntry
from simpletuner.configuration.listing import options_markdown

OPTIONS_MD = Path(__file__).resolve().parents[1] / "docs" / "OPTIONS.md"


class OptionsListingTest(unittest.TestCase):
    def test_docs_options_md_is_the_current_listing(self):
        self.assertEqual(OPTIONS_MD.read_text(encoding="utf-8"), options_markdown(),
                         "docs/OPTIONS.md is stale: python -m simpletuner options > docs/OPTIONS.md")

    def test_the_command_prints_every_option_with_type_and_default(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["options"]), 0)
        text = out.getvalue()
        for cls in (TrainingConfig, DatasetConfig, EmbedCacheEntry):
            for f in dataclasses.fields(cls):
                self.assertIn(f"| `{f.name}` |", text, f"{cls.__name__}.{f.name}")
        self.assertIn("| `lr_scheduler` | one of 'linear', 'cosine',", text)
        self.assertIn("| `train_batch_size` | an integer (>= 1) | `1` |", text)
        self.assertIn("| `peft_lora_mode` | `null`, `\"standard\"` | remove it; LoRA here is peft "
                      "LoRA", text)
        self.assertIn("| `checkpoint_step_interval` | `checkpointing_steps` (same meaning) |", text)
        self.assertIn("| `vae_cache_scan_behaviour` | accepted; caches are built once", text)

    def test_readme_links_the_options(self):
        readme = (OPTIONS_MD.parents[1] / "README.md").read_text(encoding="utf-8")
        self.assertIn("(docs/OPTIONS.md)", readme)


if __name__ == "__main__":
    unittest.main()
