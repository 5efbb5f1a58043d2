"""Validation of an edit model (flux kontext, qwen_image edit-v1), or of a ControlNet with its
control images, on the pairs of the dataset eval_dataset_id names: its first num_eval_images
targets (sorted ids, the same every run), each reference fitted to
the validation size and edited with its target's caption. Writes, per pair and size,
image-NN.png (the result) and edit-NN.png (reference | result), both with the prompt in their
PNG text, plus grid.png (one edit per row); the run report shows the edit-NN.png files."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageOps

from simpletuner.helpers.data_backend.factory import open_storage
from simpletuner.helpers.data_backend.storage import Storage
from simpletuner.helpers.multiaspect.captions import CaptionPolicy
from simpletuner.helpers.multiaspect.image import load_rgb
from simpletuner.models.pipelines import (generate_validation_images, make_grid,
                                          save_png_atomically)
from simpletuner.training.reporting.trackers import log_images
from simpletuner.training.settings import ValidationSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EditPairs:
    """What validation edits; reading captions and references waits for the first validation."""

    targets: list[str]                    # sample ids, in the order they are validated
    reference_of: dict[str, str]          # target id -> its reference's id
    references: Storage                   # the conditioning dataset's files
    caption_for: Callable[[str], str]     # the target dataset's captions, as read
    policy: CaptionPolicy

    @classmethod
    def select(cls, configuration, data, indexes) -> "EditPairs | None":
        """From the configuration, the start-up ``data`` and the indexes after caching (a pair
        whose reference failed to cache is not validated); None without eval_dataset_id."""
        name = configuration.training.eval_dataset_id
        if name is None:
            return None
        dataset = next(ds for ds in configuration.datasets if ds.id == name)
        (conditioning_id,) = dataset.conditioning_ids()  # the loader allows one
        conditioning = next(ds for ds in configuration.references if ds.id == conditioning_id)
        index = indexes[name]
        targets = sorted(s for ids in index.buckets.values() for s in ids)
        targets = targets[:configuration.training.num_eval_images]
        return cls(targets, {s: index.references[s][0] for s in targets},
                   open_storage(conditioning), data.backends[name].caption_for,
                   CaptionPolicy.for_dataset(dataset))

    def prompt(self, target: str) -> str:
        """The caption's first line (a multi-line caption trains with one line per epoch)."""
        return self.policy.candidates(self.caption_for(target))[0]

    def reference(self, target: str, size: tuple[int, int]) -> Image.Image:
        """The reference, scaled and centre-cropped to ``size`` (width, height)."""
        image = load_rgb(self.references.read_bytes(self.reference_of[target]))
        return ImageOps.fit(image, size, Image.Resampling.LANCZOS)


def save_edits(references: list[Image.Image], results: list[Image.Image], prompts: list[str],
               folder: Path) -> tuple[list[Path], list[Image.Image]]:
    """image-NN.png and edit-NN.png per edit, then grid.png; returns the paths (grid last) and
    the side-by-side images."""
    if not len(references) == len(results) == len(prompts) or not results:
        raise ValueError(f"need one reference and prompt per result, got {len(references)} "
                         f"references, {len(results)} results and {len(prompts)} prompts")
    folder.mkdir(parents=True, exist_ok=True)
    paths, edits = [], []
    for index, (reference, result, prompt) in enumerate(zip(references, results, prompts)):
        paths.append(folder / f"image-{index:02d}.png")
        save_png_atomically(result, paths[-1], prompt)
        edits.append(make_grid([reference, result], columns=2))
        paths.append(folder / f"edit-{index:02d}.png")
        save_png_atomically(edits[-1], paths[-1], prompt)
    paths.append(folder / "grid.png")
    save_png_atomically(make_grid(edits, columns=1), paths[-1])
    return paths, edits


def run_edit_validation(adapter, settings: ValidationSettings, pairs: EditPairs, step: int, *,
                        trainable=None, accelerator=None, autocast_dtype=None) -> list[Path]:
    """Each pair at each validation size (by size, then pair) into validation/step-<n>/."""
    arguments = adapter.validation_arguments(settings.pipeline_arguments())
    references, results, prompts = [], [], []
    with adapter.frozen_components_on_device():  # only for as long as sampling runs
        pipeline = adapter.validation_pipeline(adapter.build_pipeline(trainable),
                                               settings.pipeline_arguments())
        for size in settings.sizes:
            for target in pairs.targets:
                references.append(pairs.reference(target, size))
                prompts.append(pairs.prompt(target))
                results += generate_validation_images(
                    pipeline, prompts[-1:], resolution=size,
                    **{adapter.reference_image_argument: references[-1]},
                    num_inference_steps=settings.validation_num_inference_steps,
                    seed=settings.validation_seed, autocast_dtype=autocast_dtype, **arguments,
                    **adapter.size_arguments(size))
    folder = Path(settings.output_dir) / "validation" / f"step-{step}"
    paths, edits = save_edits(references, results, prompts, folder)
    if accelerator is not None:
        log_images(accelerator, {f"validation/{i:02d}": edit for i, edit in enumerate(edits)},
                   step)
    logger.info("validation edits of %d references for step %d in %s", len(pairs.targets),
                step, folder)
    return paths
