"""What a dataset kind (multidatabackend.json's ``dataset_type``) is: the one record the loader,
discovery, caching, the sampler, the audit and validation ask, instead of comparing names.
Torch-free, so ``check`` reads it without loading a model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetKind:
    name: str                      # the dataset_type value
    extensions: frozenset[str]     # the files its samples are
    trains: bool                   # the sampler trains its samples; schedule keys apply
    evaluates: bool = False        # evaluated each eval_steps_interval, every sample once
    # Paired with the targets of the dataset naming it in conditioning_data, never sampled.
    is_reference: bool = False
    takes_references: bool = False  # may name conditioning datasets in conditioning_data
    has_clips: bool = False        # clips: probed with PyAV, bucketed by frames, a video block
    reads_caption_files: bool = True  # caption_strategy 'textfile' reads <stem>.txt beside it
    # A dataset left at this kind becomes a reference dataset when it sets conditioning_type,
    # as SimpleTuner does.
    is_default: bool = False
    sample_noun: str = "image"     # how messages name one sample
    probe_noun: str = "headers read"  # what discovery does to each new file
    # (module, extra) the kind needs installed, checked before launch; None: nothing extra.
    needs: tuple[str, str] | None = None
