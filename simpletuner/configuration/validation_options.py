"""SimpleTuner's validation_resolution forms and user_prompt_library files, checked and read.

validation_resolution is an integer (a square's side), "WxH", or several of these separated by
commas ("1024x1024,1280x768"): each prompt gets one image per size. A user_prompt_library is a
JSON object of named prompts: {"name": "prompt"} or {"name": {"prompt": "..."}} ("caption" is
SimpleTuner's other key for the text).
"""

from __future__ import annotations

import json
from pathlib import Path

from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import (families_where, frame_rule, known_spec,
                                                video_families)
from simpletuner.families import spoken_list

PROMPT_KEYS = ("prompt", "caption")


def validation_sizes(value: int | str) -> list[tuple[int, int]]:
    """(width, height) of each validation size; ValueError says what is wrong with ``value``."""
    if isinstance(value, int):
        return [(value, value)]
    sizes = []
    for part in value.split(","):
        sides = part.strip().lower().split("x")
        if len(sides) not in (1, 2) or not all(side.strip().isdigit() for side in sides):
            raise ValueError(f"'{part.strip()}' is not a size: use an integer side, 'WxH', or "
                             "several separated by commas ('1024x1024,1280x768')")
        width, height = (int(sides[0]), int(sides[-1]))
        if min(width, height) < 8:
            raise ValueError(f"'{part.strip()}' is below 8 pixels")
        sizes.append((width, height))
    return sizes


def library_prompts(path: str | Path) -> list[str]:
    """The prompts of a user_prompt_library file, in file order; ValueError says what is wrong
    (the loader reports it before the run, so a run reads a checked file)."""
    try:
        library = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path} ({error.strerror})") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error.msg} at line {error.lineno})") from error
    if not isinstance(library, dict) or not library:
        raise ValueError(f"{path} must hold a JSON object of named prompts, "
                         "{\"name\": \"prompt\", ...}")
    prompts = []
    for name, entry in library.items():
        text = entry if isinstance(entry, str) else next(
            (entry[key] for key in PROMPT_KEYS if isinstance(entry, dict)
             and isinstance(entry.get(key), str)), None)
        if not text:
            raise ValueError(f"{path}: entry '{name}' has no prompt (a string, or an object "
                             "with 'prompt' or 'caption')")
        prompts.append(text)
    return prompts


def check_validation_options(training, where: Location, problems: list[Problem]) -> None:
    """The validation options of a TrainingConfig that need more than their own type: sizes
    parse, the library file reads (the loader made its path absolute), options fit the
    family."""
    if isinstance(training.validation_resolution, str):
        try:
            validation_sizes(training.validation_resolution)
        except ValueError as error:
            problems.append(where.problem(
                "validation_resolution", f"key 'validation_resolution': {error}"))
    if training.user_prompt_library is not None:
        try:
            library_prompts(training.user_prompt_library)
        except ValueError as error:
            problems.append(where.problem(
                "user_prompt_library", f"key 'user_prompt_library': {error}"))
    _check_family_options(training, where, problems)
    _check_video_frames(training.validation_num_video_frames, training.model_family, where,
                        problems)


def _check_family_options(training, where: Location, problems: list[Problem]) -> None:
    """Validation options the family's pipeline has no use for, as its spec says."""
    family, spec = training.model_family, known_spec(training.model_family)
    if training.validation_guidance_rescale and not (spec and spec.guidance_rescale):
        rescaled = spoken_list(families_where(lambda spec: spec.guidance_rescale))
        problems.append(where.problem(
            "validation_guidance_rescale", f"key 'validation_guidance_rescale' applies to "
            f"{rescaled}; the {family} pipeline has no guidance rescale. Remove it."))
    for key, reason in (spec.refused_options.items() if spec else ()):
        if getattr(training, key) is not None:
            problems.append(where.problem(key, f"key '{key}': {reason}"))
    if training.validation_guidance_skip_layers and not (spec and spec.skip_layer_guidance):
        skipping = spoken_list(families_where(lambda spec: spec.skip_layer_guidance))
        problems.append(where.problem(
            "validation_guidance_skip_layers", f"key 'validation_guidance_skip_layers' applies "
            f"to {skipping} only (skip-layer guidance); model_family is '{family}'. Remove it."))


def _check_video_frames(frames: int | None, family: str, where: Location,
                        problems: list[Problem]) -> None:
    """validation_num_video_frames: for a family that makes clips, a count its VAE encodes."""
    if frames is None:
        return
    rule = frame_rule(family)
    if rule is None:
        problems.append(where.problem(
            "validation_num_video_frames", "key 'validation_num_video_frames' applies to the "
            f"video families ({', '.join(video_families())}); '{family}' validates with images. "
            "Remove it."))
    elif refusal := rule.refusal(family, frames):
        problems.append(where.problem(
            "validation_num_video_frames", f"key 'validation_num_video_frames' ({frames}) "
            f"{refusal}"))
