"""Validation images during training: main rank only, fixed seed, PNGs plus a grid, and the
same images in the trackers that show images (tensorboard, wandb)."""

from __future__ import annotations

import logging
from pathlib import Path

from simpletuner.models.pipelines import generate_validation_images, save_validation_images
from simpletuner.training.reporting.trackers import log_images
from simpletuner.training.settings import ValidationSettings

logger = logging.getLogger(__name__)


def is_validation_step(settings: ValidationSettings, step: int, last_step: int) -> bool:
    """Every validation_steps steps (0 = only at the end), and always at the end."""
    if not settings.prompts:
        return False
    if step == last_step:
        return True
    return bool(settings.validation_steps) and step % settings.validation_steps == 0


def run_validation(adapter, settings: ValidationSettings, step: int, *, trainable=None,
                   accelerator=None, autocast_dtype=None) -> list[Path]:
    """Generate and save one image per prompt and validation size into
    output_dir/validation/step-<n>/ (by size, then prompt)."""
    prompts = settings.prompts
    images, labels = [], []
    with adapter.frozen_components_on_device():  # only for as long as sampling runs
        pipeline = adapter.build_pipeline(trainable)
        for size in settings.sizes:
            images += generate_validation_images(
                pipeline, prompts, resolution=size,
                num_inference_steps=settings.validation_num_inference_steps,
                seed=settings.validation_seed, autocast_dtype=autocast_dtype,
                **adapter.validation_arguments(settings.pipeline_arguments()),
                **adapter.size_arguments(size))
            labels += prompts
    folder = Path(settings.output_dir) / "validation" / f"step-{step}"
    paths = save_validation_images(images, labels, folder)
    if accelerator is not None:
        log_images(accelerator, {f"validation/{i:02d}": image for i, image in enumerate(images)},
                   step)
    logger.info("validation images for step %d in %s", step, folder)
    return paths
