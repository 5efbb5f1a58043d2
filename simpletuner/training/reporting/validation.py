"""Validation during training: main rank only, fixed seed. Image families write PNGs plus a
grid; video families (Wan) write each prompt's clip (validation_clips.py), and one that makes
sound (LTX-2) an MP4 with its audio track too (validation_sound.py). The trackers that
show images (tensorboard, wandb) get the images, or each clip's frame strip."""

from __future__ import annotations

import logging
from pathlib import Path

from simpletuner.models.pipelines import (first_clip, first_clip_and_sound,
                                          generate_validation_images, save_validation_images)
from simpletuner.training.reporting.trackers import log_images
from simpletuner.training.reporting.validation_clips import frame_strip, save_validation_clips
from simpletuner.training.reporting.validation_edits import EditPairs, run_edit_validation
from simpletuner.training.reporting.validation_inputs import validation_input_images
from simpletuner.training.reporting.validation_sound import save_validation_mp4s
from simpletuner.training.settings import ValidationSettings

logger = logging.getLogger(__name__)


def is_validation_step(settings: ValidationSettings, step: int, last_step: int) -> bool:
    """Every validation_steps steps (0 = only at the end), and always at the end."""
    if not settings.enabled:
        return False
    if step == last_step:
        return True
    return bool(settings.validation_steps) and step % settings.validation_steps == 0


def clip_frames(adapter, settings: ValidationSettings) -> int | None:
    """Frames of each validation clip: validation_num_video_frames, else the family's
    pipeline default; None for an image family."""
    if adapter.default_validation_frames is None:
        return None
    return settings.validation_num_video_frames or adapter.default_validation_frames


def run_validation(adapter, settings: ValidationSettings, step: int, *, trainable=None,
                   accelerator=None, autocast_dtype=None, images=None) -> list[Path]:
    """Generate and save num_validation_images images (or clips) per prompt and validation
    size into output_dir/validation/step-<n>/ (by size, then prompt, then seed); ``images``:
    each prompt's input image (validation_inputs.py), for an image-to-video model."""
    copies = settings.num_validation_images
    prompts = [prompt for prompt in settings.prompts for _ in range(copies)]
    seeds = [settings.validation_seed + k for _ in settings.prompts for k in range(copies)]
    if images is not None:
        images = [image for image in images for _ in range(copies)]
    frames = clip_frames(adapter, settings)
    arguments = settings.pipeline_arguments()
    sounding = frames is not None and adapter.audio_input is not None
    if frames is not None:
        arguments.update(num_frames=frames, keep=first_clip_and_sound if sounding else first_clip)
    outputs, labels = [], []
    with adapter.frozen_components_on_device():  # only for as long as sampling runs
        pipeline = adapter.validation_pipeline(adapter.build_pipeline(trainable), arguments)
        for size in settings.sizes:
            outputs += generate_validation_images(
                pipeline, prompts, resolution=size,
                num_inference_steps=settings.validation_num_inference_steps,
                seed=seeds, autocast_dtype=autocast_dtype,
                input_images=images,
                **adapter.validation_arguments(arguments),
                **adapter.size_arguments(size))
            labels += prompts
    folder = Path(settings.output_dir) / "validation" / f"step-{step}"
    if frames is None:
        paths, shown = save_validation_images(outputs, labels, folder), outputs
    else:
        framerate = settings.validation_framerate or adapter.default_validation_framerate
        sounds = None
        if sounding:  # (frames, sound) each: an MP4 with its audio track besides
            outputs, sounds = [clip for clip, _ in outputs], [sound for _, sound in outputs]
        paths = save_validation_clips(outputs, labels, folder, framerate)
        if sounds is not None:
            paths += save_validation_mp4s(outputs, sounds, folder, framerate,
                                          adapter.validation_sample_rate)
        shown = [frame_strip(clip) for clip in outputs]
    if accelerator is not None:
        log_images(accelerator, {f"validation/{i:02d}": image for i, image in enumerate(shown)},
                   step)
    logger.info("validation %s for step %d in %s", "images" if frames is None else "clips",
                step, folder)
    return paths


def validate_model(adapter, settings: ValidationSettings, step: int, *,
                   edit_pairs: EditPairs | None, datasets, indexes, trainable=None, accelerator=None,
                   autocast_dtype=None) -> list[Path]:
    """An edit model edits its validation references (validation_edits.py); any other model
    generates from the prompts, an image-to-video one from an input image each."""
    if edit_pairs is not None:
        return run_edit_validation(adapter, settings, edit_pairs, step, trainable=trainable,
                                   accelerator=accelerator, autocast_dtype=autocast_dtype)
    return run_validation(adapter, settings, step, trainable=trainable, accelerator=accelerator,
                          autocast_dtype=autocast_dtype,
                          images=validation_input_images(datasets, indexes, settings))
