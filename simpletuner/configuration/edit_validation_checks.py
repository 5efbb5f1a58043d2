"""eval_dataset_id: the edit pairs whose references validation edits (a ControlNet's: the control
images it generates from), checked against the model
and the dataset file (SimpleTuner's key; its Kontext guide leaves validation_using_datasets
off, because the paired references are what validation takes)."""

from __future__ import annotations

from simpletuner.configuration.conditioning_checks import reference_models_text, takes_references
from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import known_spec


def check_edit_validation(training, datasets: list, where: Location,
                          problems: list[Problem]) -> None:
    """Every problem with eval_dataset_id, appended to ``problems``."""
    name = training.eval_dataset_id
    if name is None:
        _check_prompt_only_validation(training, where, problems)
        return
    key, name_key = "key 'eval_dataset_id'", "eval_dataset_id"
    if not takes_references(training.model_family, training.model_flavour) and not (
            training.controlnet):
        problems.append(where.problem(
            name_key, f"{key} picks the edit pairs that validation edits, which only edit models "
            f"do ({reference_models_text()}); remove it (every enabled eval dataset's loss is "
            "logged)"))
        return
    dataset = {ds.id: ds for ds in datasets}.get(name)
    if dataset is None:
        problems.append(where.problem(
            name_key, f"{key} names {name!r}, which is not an enabled dataset of the dataset "
            "file; name the dataset whose conditioning_data holds the references"))
    elif not dataset.conditioning_ids():
        problems.append(where.problem(
            name_key, f"{key} names '{name}', which has no conditioning_data; name a dataset "
            "paired with references"))
    elif len(dataset.conditioning_ids()) > 1:
        problems.append(where.problem(
            name_key, f"{key} names '{name}', whose targets have "
            f"{len(dataset.conditioning_ids())} references each; validation edits one reference "
            "image per target: name a dataset with one conditioning dataset"))
    if training.validation_prompt is not None or training.user_prompt_library is not None:
        problems.append(where.problem(
            name_key, f"{key}: validation edits the references of '{name}' with their targets' "
            "captions as prompts; remove validation_prompt and user_prompt_library, or remove "
            "eval_dataset_id for text-to-image validation"))
    if training.validation_using_datasets:
        problems.append(where.problem(
            "validation_using_datasets", "key 'validation_using_datasets' takes image-to-video "
            f"models' input images; the edit model's validation edits the references of '{name}' "
            "(eval_dataset_id): remove it"))


def _check_prompt_only_validation(training, where: Location, problems: list[Problem]) -> None:
    """An edit flavour whose pipeline edits an image (Qwen-Image-Edit's), or a ControlNet's,
    cannot generate from a prompt alone."""
    spec = known_spec(training.model_family)
    if training.controlnet:
        pipeline = "a ControlNet pipeline generates from a control image and"
    elif spec is None or not spec.edits_need_references or not takes_references(
            training.model_family, training.model_flavour):
        return
    else:
        pipeline = "a Qwen-Image-Edit pipeline edits a reference image and"
    for key in ("validation_prompt", "user_prompt_library"):
        if getattr(training, key) is not None:
            problems.append(where.problem(
                key, f"key '{key}': {pipeline} cannot generate from a prompt alone; set "
                "eval_dataset_id to a dataset paired with those images (its targets' captions "
                f"are the prompts), or remove {key}"))
