"""What the sampler hands to the dataset: one micro-batch of sample references."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class BatchSample:
    dataset_id: str
    sample_id: str                 # path relative to the dataset root, '/' separators
    bucket: str                    # "WxH"
    target_size: tuple[int, int]   # (width, height) in pixels, parsed from the bucket key
    caption: str | None            # None in a plan (MultiAspectSampler.plans)
    references: tuple[str, ...] = ()  # edit pairs: its reference in each conditioning dataset


@dataclass(frozen=True)
class MicroBatch:
    """Micro-batch ``step`` of ``epoch``; every rank draws step i from the same bucket.

    A ``stand_in`` (evaluation only) holds a sample of the bucket so that a rank whose share
    ended runs the same steps as the others; its result is not counted."""

    epoch: int
    step: int
    dataset_id: str
    bucket: str
    samples: tuple[BatchSample, ...]
    stand_in: bool = False

    def without_captions(self) -> "MicroBatch":
        """The plan alone, as MultiAspectSampler.plans hands it out."""
        return replace(self, samples=tuple(replace(s, caption=None) for s in self.samples))
