"""The Qwen2-style tokenizer the tiny Qwen-based models use is written locally and reads text as
the real one's byte-level BPE does: every byte a token, chat tokens whole."""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from transformers import AutoTokenizer, Qwen2Tokenizer

from simpletuner.models.tiny.tokenizers import write_tiny_qwen2_tokenizer


class TinyQwen2TokenizerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = Path(cls.enterClassContext(tempfile.TemporaryDirectory())) / "tokenizer"
        cls.ids = write_tiny_qwen2_tokenizer(cls.folder, 48, ("<|vision_start|>",))

    def test_loads_offline_by_both_classes_and_round_trips_any_text(self):
        text = "<|im_start|>user\nA red circle, naïve café ✓<|im_end|>"
        for tokenizer_class in (Qwen2Tokenizer, AutoTokenizer):
            with self.subTest(tokenizer_class=tokenizer_class.__name__):
                tokenizer = tokenizer_class.from_pretrained(self.folder)
                ids = tokenizer(text).input_ids
                self.assertEqual(tokenizer.decode(ids), text)
                self.assertEqual(ids[0], tokenizer.convert_tokens_to_ids("<|im_start|>"))
                self.assertEqual(ids[-1], self.ids["eos_token_id"])
                self.assertEqual(ids[1:5], list(b"user"))  # one token per byte, id = byte

    def test_padding_uses_endoftext_and_respects_max_length(self):
        tokenizer = Qwen2Tokenizer.from_pretrained(self.folder)
        self.assertEqual(tokenizer.model_max_length, 48)
        batch = tokenizer(["hi", "x" * 100], padding="max_length", max_length=48,
                          truncation=True)
        self.assertEqual([len(row) for row in batch.input_ids], [48, 48])
        self.assertEqual(batch.input_ids[0][2:], [self.ids["pad_token_id"]] * 46)
        self.assertEqual(batch.attention_mask[0][:3], [1, 1, 0])

    def test_extra_special_tokens_are_single_tokens_after_the_chat_tokens(self):
        tokenizer = Qwen2Tokenizer.from_pretrained(self.folder)
        self.assertEqual(tokenizer("<|vision_start|>").input_ids, [259])
        self.assertEqual(self.ids["vocab_size"], 260)


if __name__ == "__main__":
    unittest.main()
