"""validation_using_datasets (SimpleTuner's option): the input images of an image-to-video
model's validation. Prompt i animates the first frame, as displayed and unfitted (the pipeline
resizes it to each validation size), of sample i (cycling) of the first training dataset that
has samples, in sorted order: the same images at every validation and on every run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from PIL import Image

from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.multiaspect.clip import decode_frames
from simpletuner.helpers.multiaspect.image import load_rgb


def validation_input_problems(adapter_class, training, where: str) -> list[str]:
    """What stops the validation settings from working with this kind of model."""
    validating = bool(training.validation_prompt or training.user_prompt_library) and not (
        training.validation_disable)
    if adapter_class.validates_from_image and validating and not (
            training.validation_using_datasets):
        return [f"{where}: key 'validation_prompt': this image-to-video model animates an "
                "input image at validation; set validation_using_datasets true (each prompt "
                "animates a training sample's first frame), or validation_disable true"]
    if training.validation_using_datasets and not adapter_class.validates_from_image:
        return [f"{where}: key 'validation_using_datasets': only image-to-video models (Wan "
                "I2V) take validation inputs here; remove it (an edit model such as flux "
                "kontext validates the references of the dataset eval_dataset_id names)"]
    return []


def validation_input_images(datasets: Sequence, indexes: Mapping[str, DatasetIndex],
                            settings) -> list[Image.Image] | None:
    """One input image per validation prompt, or None without validation_using_datasets.
    ``datasets`` are configuration.DatasetConfig in config order, ``indexes`` what trains."""
    if not settings.validation_using_datasets or not settings.prompts:
        return None
    for dataset in datasets:
        index = indexes.get(dataset.id)
        if not kind_of(dataset).trains or index is None or not index.sample_count:
            continue
        samples = sorted(s for ids in index.buckets.values() for s in ids)
        storage = open_storage(dataset)
        chosen = [samples[i % len(samples)] for i in range(len(settings.prompts))]
        return [_first_frame(storage.read_bytes(s), s in index.clips) for s in chosen]
    raise ValueError("validation_using_datasets: no training dataset has a sample to take "
                     "validation images from")


def _first_frame(data: bytes, is_clip: bool) -> Image.Image:
    return decode_frames(data, 1)[0] if is_clip else load_rgb(data)
