"""A byte-level CLIP tokenizer written locally, so built-in tiny models never download one.

The vocabulary is every byte (as CLIP's printable byte alphabet), each byte again with the
end-of-word suffix, and the two special tokens; no merges. Any text tokenizes, one token per
byte, which is all a tiny test model needs."""

from __future__ import annotations

import json
from pathlib import Path

START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"


def _byte_alphabet() -> list[str]:
    """The 256 printable characters GPT-2/CLIP byte-level BPE uses for the 256 byte values."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    codes = dict(zip(printable, printable))
    shifted = 0
    for byte in range(256):
        if byte not in codes:
            codes[byte] = 256 + shifted
            shifted += 1
    return [chr(codes[byte]) for byte in range(256)]


def tiny_vocab() -> dict[str, int]:
    alphabet = _byte_alphabet()
    tokens = alphabet + [c + "</w>" for c in alphabet] + [START_TOKEN, END_TOKEN]
    return {token: index for index, token in enumerate(tokens)}


def write_tiny_tokenizer_files(folder: Path, max_length: int) -> dict[str, int]:
    """Write vocab.json, merges.txt and tokenizer_config.json that CLIPTokenizer.from_pretrained
    reads; return the special token ids the matching text encoder config needs."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocab()
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    config = {"model_max_length": max_length, "bos_token": START_TOKEN, "eos_token": END_TOKEN,
              "pad_token": END_TOKEN, "unk_token": END_TOKEN}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return {"vocab_size": len(vocab), "bos_token_id": vocab[START_TOKEN],
            "eos_token_id": vocab[END_TOKEN], "pad_token_id": vocab[END_TOKEN]}


def write_tiny_t5_tokenizer(folder: Path, max_length: int) -> dict[str, int]:
    """Save a T5Tokenizer (tokenizer.json, loads offline with from_pretrained) whose unigram
    vocabulary is every printable ASCII character, alone and word-initial ("▁a"); any text
    tokenizes (unknown characters become <unk>). Return the ids a T5 config needs."""
    import string

    from transformers import T5Tokenizer

    characters = [c for c in string.printable if not c.isspace()]
    # T5's layout: <pad> 0, </s> 1, <unk> 2; word-initial pieces score higher, so a word
    # starts with one of them.
    vocab = ([("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
             + [("▁" + c, -3.0) for c in characters] + [(c, -3.5) for c in characters])
    tokenizer = T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=max_length)
    tokenizer.save_pretrained(folder)
    return {"vocab_size": len(vocab), "pad_token_id": 0, "eos_token_id": 1,
            "decoder_start_token_id": 0}


QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

# Qwen3's template for plain chat messages: Z-Image's pipeline applies it with
# enable_thinking=True (the assistant turn only opens), FLUX.2-klein's with False (an empty
# think block follows).
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}")


def write_tiny_qwen2_tokenizer(folder: Path, max_length: int,
                               extra_special_tokens: tuple[str, ...] = (),
                               chat_template: str | None = None) -> dict[str, int]:
    """Save a byte-level Qwen2Tokenizer (the tokenizer of Qwen2.5-VL and Qwen3) with no merges:
    one token per byte, id = byte value, then Qwen's chat tokens and ``extra_special_tokens``,
    so chat templates tokenize as in the real model; ``chat_template`` (Jinja) for pipelines
    that call apply_chat_template. Return the ids a Qwen config needs."""
    from transformers import Qwen2Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    special = list(QWEN_SPECIAL_TOKENS) + list(extra_special_tokens)
    vocab = {token: index for index, token in enumerate(_byte_alphabet() + special)}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    config = {"model_max_length": max_length, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "bos_token": None,
              "additional_special_tokens": special[1:]}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    # Saved again as tokenizer.json, the one file Qwen2Tokenizer and AutoTokenizer both read.
    Qwen2Tokenizer.from_pretrained(folder).save_pretrained(folder)
    (folder / "vocab.json").unlink()
    (folder / "merges.txt").unlink()
    return {"vocab_size": len(vocab), "pad_token_id": vocab["<|endoftext|>"],
            "eos_token_id": vocab["<|im_end|>"], "bos_token_id": vocab["<|endoftext|>"]}
