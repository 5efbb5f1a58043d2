"""Reference-image (edit) datasets: which dataset names which ``dataset_type: conditioning``
dataset in ``conditioning_data``, checked across the dataset file and against the model."""

from __future__ import annotations

from dataclasses import replace

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.families import known_spec
from simpletuner.dataset_kinds import kind_named, kind_names, kind_of
from simpletuner.families import family_specs

CONDITIONING = "conditioning"


def reference_models_text() -> str:
    """How messages name the models that train on reference images (the specs' reference
    flavours): "model_family 'a' with model_flavour 'x', or 'b' with 'y' or 'z'"."""
    models = [spec for spec in family_specs() if spec.reference_flavours]
    return "model_family " + ", or ".join(
        f"'{spec.name}' with {'' if index else 'model_flavour '}"
        + " or ".join(f"'{flavour}'" for flavour in spec.reference_flavours)
        for index, spec in enumerate(models))


def as_conditioning(ds: DatasetConfig, controlnet: bool) -> DatasetConfig:
    """SimpleTuner makes a dataset with conditioning_type a conditioning dataset, whatever its
    dataset_type says when left at 'image'; under controlnet a conditioning dataset without
    conditioning_type holds control images, as its ControlNet guide writes them."""
    if ds.conditioning_type is not None and kind_of(ds).is_default:
        return replace(ds, dataset_type=CONDITIONING)
    if controlnet and ds.conditioning_type is None and kind_of(ds).is_reference:
        return replace(ds, conditioning_type="controlnet")
    return ds


def with_references(parsed: list[DatasetConfig], listed: object, training, where: Location,
                    problems: list[Problem]) -> list[DatasetConfig]:
    """The parsed datasets, those with a conditioning_type made conditioning datasets, after
    appending every problem of their pairing (``listed``: the file's raw list)."""
    controlnet = bool(getattr(training, "controlnet", False))
    datasets = [as_conditioning(ds, controlnet) for ds in parsed]
    check_conditioning(datasets, training, where, problems,
                       listed=listed if isinstance(listed, list) else [])
    return datasets


def takes_references(model_family: str | None, model_flavour: str | None) -> bool:
    spec = known_spec(model_family)
    return spec is not None and model_flavour in spec.reference_flavours


def check_conditioning(datasets: list[DatasetConfig], training, where: Location,
                       problems: list[Problem], listed: list) -> None:
    """Every problem with conditioning_data, conditioning_type and the conditioning datasets,
    appended to ``problems``; ``training`` may be None (config.json unusable). ``listed``: the
    file's raw entries, so a dataset left out for its own problems is not called missing."""
    by_id = {ds.id: ds for ds in datasets}
    unusable = {item.get("id") for item in listed
                if isinstance(item, dict) and not item.get("disabled")} - set(by_id)
    named_by: dict[str, str] = {}  # conditioning dataset id -> the dataset naming it
    for ds in datasets:
        label = where.entry(ds.id, f"dataset '{ds.id}'")
        kind = kind_of(ds)
        if ds.conditioning_type is not None and not kind.is_reference:
            problems.append(label.problem(
                "conditioning_type", "key 'conditioning_type' belongs to a dataset with "
                "'dataset_type': 'conditioning'", "remove it or set that type"))
        if kind.is_reference:
            _check_conditioning_entry(ds, label, problems)
        if not ds.conditioning_ids():
            continue
        if not kind.takes_references:
            takers = " and ".join(k for k in kind_names() if kind_named(k).takes_references)
            problems.append(label.problem(
                "conditioning_data", f"key 'conditioning_data' is for {takers} datasets, "
                f"not '{ds.dataset_type}'"))
        _check_reference_count(ds, training, label, problems)
        _check_pixel_conditioning(ds, kind, by_id, label, problems)
        for name in ds.conditioning_ids():
            if name not in unusable:  # else its own problems are reported
                _check_named(name, ds.id, by_id, named_by, label, problems)
        loose = [name for name in ds.conditioning_ids()
                 if getattr(by_id.get(name), "conditioning_type", None) == "reference_loose"]
        batch = 1 if kind.evaluates else (  # evaluation: one sample per rank
            ds.train_batch_size or getattr(training, "train_batch_size", 1))
        if loose and batch != 1:
            problems.append(label.problem(
                "conditioning_data", f"its references ({', '.join(loose)}) are "
                "'reference_loose', each in its own aspect bucket, so they cannot share a "
                f"micro-batch; set train_batch_size 1 (it is {batch}; "
                "gradient_accumulation_steps can make up the batch), or use 'reference_strict'"))
    for ds in datasets:
        if kind_of(ds).is_reference and ds.id not in named_by:
            problems.append(where.entry(ds.id).problem(
                "dataset_type", f"dataset '{ds.id}' has 'dataset_type': 'conditioning' but no "
                "dataset names it in 'conditioning_data'; name it from the training dataset "
                "whose references it holds, or remove it"))
    _check_controls(datasets, training, where, problems)
    references = sorted(name for name in named_by
                        if not by_id[name].is_mask and not by_id[name].is_control)
    if references and training is not None and not takes_references(
            training.model_family, training.model_flavour):
        problems.append(where.problem(
            "", f"conditioning datasets ({', '.join(references)}) hold reference images, "
            f"which model_family '{training.model_family}' (model_flavour "
            f"{training.model_flavour!r}) does not train on; use {reference_models_text()}, or "
            "remove conditioning_data"))


def _check_reference_count(ds: DatasetConfig, training, label: Location,
                           problems: list[Problem]) -> None:
    spec = known_spec(getattr(training, "model_family", None))
    flavour = getattr(training, "model_flavour", None)
    flavours = spec.reference_flavours if spec is not None else {}
    most = flavours.get(flavour)
    if most is not None and len(ds.conditioning_ids()) > most:
        roomier = [f", or use model_flavour '{other}' (up to {count})"
                   for other, count in flavours.items() if count is not None and count > most]
        problems.append(label.problem(
            "conditioning_data", f"key 'conditioning_data' names {len(ds.conditioning_ids())} "
            f"conditioning datasets, but model_flavour '{flavour}' reads at most {most} "
            f"reference(s) per sample; name at most {most}" + "".join(roomier)))


def _check_pixel_conditioning(ds: DatasetConfig, kind, by_id: dict[str, DatasetConfig],
                              label: Location, problems: list[Problem]) -> None:
    """A mask or control-image dataset is named alone, by an image (or eval) dataset."""
    named = [by_id[name] for name in ds.conditioning_ids()
             if isinstance(name, str) and name in by_id
             and (by_id[name].is_mask or by_id[name].is_control)]
    if not named:
        return
    what = f"the {named[0].conditioning_type} dataset '{named[0].id}'"
    if len(ds.conditioning_ids()) > 1:
        problems.append(label.problem(
            "conditioning_data", f"key 'conditioning_data' names {what} with other "
            "conditioning datasets, which is not supported: name it alone"))
    if kind.has_clips:
        problems.append(label.problem(
            "conditioning_data", f"key 'conditioning_data' names {what}, which is for image "
            f"datasets, not '{ds.dataset_type}'; remove it"))


def _check_controls(datasets: list[DatasetConfig], training, where: Location,
                    problems: list[Problem]) -> None:
    """Control images train a ControlNet (controlnet: true), and a ControlNet needs them."""
    controlnet = bool(getattr(training, "controlnet", False))
    controls = sorted(ds.id for ds in datasets if ds.is_control)
    if controls and training is not None and not controlnet:
        problems.append(where.problem(
            "", f"conditioning datasets ({', '.join(controls)}) hold ControlNet control images "
            "(conditioning_type 'controlnet'); set controlnet: true in config.json, or remove "
            "them"))
    spec = known_spec(getattr(training, "model_family", None))
    if not controlnet or spec is None or spec.controlnet_adapter is None or (
            training.model_type != "full"):  # controlnet itself is refused (training_checks)
        return
    by_id = {ds.id: ds for ds in datasets}
    for ds in datasets:
        if kind_of(ds).trains and not any(
                getattr(by_id.get(name), "is_control", False) for name in ds.conditioning_ids()):
            problems.append(where.entry(ds.id, f"dataset '{ds.id}'").problem(
                "conditioning_data", "controlnet: true trains on control images: name the "
                "conditioning dataset holding this dataset's control images (conditioning_type "
                "'controlnet', matched by stem) in its conditioning_data"))


def _check_conditioning_entry(ds: DatasetConfig, label: Location, problems: list[Problem]) -> None:
    if ds.conditioning_type is None:
        problems.append(label.problem(
            "conditioning_type", "a 'conditioning' dataset needs 'conditioning_type': "
            "'reference_strict' (each reference resized and cropped like its target), "
            "'reference_loose' (in its own aspect bucket), 'mask' (each target's loss mask) or "
            "'controlnet' (each target's control image, with controlnet: true)"))
    if ds.conditioning_ids():
        problems.append(label.problem(
            "conditioning_data", "a 'conditioning' dataset cannot itself name "
            "'conditioning_data'; set it on the training dataset"))


def _check_named(name: object, owner: str, by_id: dict[str, DatasetConfig],
                 named_by: dict[str, str], label: Location, problems: list[Problem]) -> None:
    target = by_id.get(name) if isinstance(name, str) else None
    if target is None:
        problems.append(label.problem(
            "conditioning_data", f"key 'conditioning_data' names {name!r}, which is not an "
            "enabled dataset of this file; add it with 'dataset_type': 'conditioning' or fix the "
            "id"))
    elif not kind_of(target).is_reference:
        problems.append(label.problem(
            "conditioning_data", f"key 'conditioning_data' names '{name}', whose dataset_type is "
            f"'{target.dataset_type}'; set its 'dataset_type': 'conditioning'"))
    elif name in named_by:
        problems.append(label.problem(
            "conditioning_data", f"key 'conditioning_data' names '{name}', which dataset "
            f"'{named_by[name]}' names already; give each training dataset its own conditioning "
            "dataset"))
    else:
        named_by[name] = owner
