"""Which caption a sample trains with in an epoch: SimpleTuner's caption options, made pure.

A caption file may hold several captions, one per line: each epoch uses one line, and with
``caption_dropout_probability`` p a fraction p of the samples trains with the empty caption
instead. Both choices come from a stable digest of (seed, dataset id, sample id, epoch), so a
resumed run and every rank make exactly the choices the uninterrupted run makes, and the global
RNGs are never touched. Every caption a sample can get is known up front (``candidates``), so
the text-embedding cache holds them all before training; the empty caption is cached once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from simpletuner.common.names import name_bytes
from simpletuner.dataset_kinds import kind_of

EMPTY_CAPTION = ""
_SCALE = float(1 << 64)


@dataclass(frozen=True)
class CaptionPolicy:
    """The defaults change nothing but the split of multi-line captions (SimpleTuner's default)."""

    dropout_probability: float = 0.0
    split_lines: bool = True
    instance_prompt: str | None = None
    prepend_instance_prompt: bool = False
    only_instance_prompt: bool = False

    @classmethod
    def for_dataset(cls, dataset) -> "CaptionPolicy":
        """From a configuration.DatasetConfig (whose dropout the loader filled from config.json);
        evaluation datasets never drop captions, so their loss measures the captioned task."""
        evaluation = kind_of(dataset).evaluates
        return cls(
            dropout_probability=0.0 if evaluation else dataset.caption_dropout_probability or 0.0,
            split_lines=not dataset.disable_multiline_split,
            instance_prompt=dataset.instance_prompt,
            prepend_instance_prompt=dataset.prepend_instance_prompt,
            only_instance_prompt=dataset.only_instance_prompt,
        )

    def candidates(self, text: str) -> list[str]:
        """Every caption ``text`` (a sample's caption as read) can give, dropout aside."""
        if self.only_instance_prompt:
            return [self.instance_prompt or EMPTY_CAPTION]
        lines = [line.strip() for line in text.splitlines()] if self.split_lines else [text]
        lines = [line for line in lines if line] or [text.strip()]
        if self.prepend_instance_prompt and self.instance_prompt:
            lines = [f"{self.instance_prompt} {line}".strip() for line in lines]
        return lines

    @property
    def may_drop(self) -> bool:
        """Whether the empty caption is ever chosen (then the text cache needs it too)."""
        return self.dropout_probability > 0.0

    def choose(self, text: str, *, seed: int, dataset_id: str, sample_id: str, epoch: int) -> str:
        options = self.candidates(text)
        if not self.may_drop and len(options) == 1:
            return options[0]
        drop, line = _draws(seed, dataset_id, sample_id, epoch)
        if drop < self.dropout_probability:
            return EMPTY_CAPTION
        return options[int(line * len(options))]


def _draws(seed: int, dataset_id: str, sample_id: str, epoch: int) -> tuple[float, float]:
    """Two independent uniforms in [0, 1) for one sample in one epoch; never Python's hash()."""
    payload = name_bytes(f"caption\x00{seed}\x00{dataset_id}\x00{sample_id}\x00{epoch}")
    raw = hashlib.sha256(payload).digest()
    return (int.from_bytes(raw[:8], "big") / _SCALE, int.from_bytes(raw[8:16], "big") / _SCALE)
