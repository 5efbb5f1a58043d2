"""Checks of the dataset schedule (probability, start and end) and of prior
preservation (is_regularisation_data) across the datasets and config.json, before heavy work."""

from __future__ import annotations

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import Location, Problem
from simpletuner.configuration.options import TrainingConfig
from simpletuner.dataset_kinds import kind_of

SCHEDULE_KEYS = ("probability", "start_epoch", "start_step", "end_epoch", "end_step",
                 "is_regularisation_data")


def _label(ds: DatasetConfig) -> str:
    return f"dataset '{ds.id}'"


def _starts_at_once(ds: DatasetConfig) -> bool:
    return ds.start_epoch <= 1 and ds.start_step <= 1


def check_dataset_schedule(datasets: list[DatasetConfig], training: TrainingConfig | None,
                           where: Location, problems: list[Problem]) -> None:
    """Every problem of the schedule keys at once: where each applies, what never starts."""
    training_sets = [ds for ds in datasets if kind_of(ds).trains]
    for ds in datasets:
        if not kind_of(ds).trains:
            set_keys = [key for key in SCHEDULE_KEYS
                        if getattr(ds, key) != DatasetConfig.__dataclass_fields__[key].default]
            if set_keys:
                problems.append(where.entry(ds.id).problem(
                    set_keys[0], f"{_label(ds)}: {', '.join(set_keys)} shape training; an 'eval' "
                    "dataset evaluates every sample at each evaluation. Remove them."))
            continue
        _check_end(ds, where, problems)
        if ds.probability == 0:
            problems.append(where.entry(ds.id).problem(
                "probability", f"{_label(ds)}: probability 0 would never draw it; set "
                "'disabled': true to leave it out, or a probability above 0 (at most 1: the odds "
                "relative to the other datasets)"))
    if training_sets and not any(_starts_at_once(ds) for ds in training_sets):
        starts = "; ".join(f"'{ds.id}' start_epoch {ds.start_epoch}, start_step "
                           f"{ds.start_step}" for ds in training_sets)
        problems.append(where.problem(
            "", f"no training dataset starts at the first step ({starts}); give at least one "
            "start_epoch 1 and start_step 0 (the defaults)"))
    if training_sets and all(ds.end_epoch or ds.end_step for ds in training_sets):
        problems.append(where.problem(
            "", "every training dataset has an end_epoch or end_step, so after the last one ends "
            "nothing is left to train; remove them from the dataset that should train to the end"))
    if training is not None:
        _check_against_training(training_sets, training, where, problems)


def _check_end(ds: DatasetConfig, where: Location, problems: list[Problem]) -> None:
    """An end before the start would leave the dataset out of every epoch (SimpleTuner refuses
    it too)."""
    if ds.end_epoch and ds.end_epoch < max(ds.start_epoch, 1):
        problems.append(where.entry(ds.id).problem(
            "end_epoch", f"{_label(ds)}: end_epoch {ds.end_epoch} is before start_epoch "
            f"{max(ds.start_epoch, 1)}, so it would never be drawn; raise end_epoch or lower "
            "start_epoch"))
    if ds.end_step and ds.end_step < max(ds.start_step, 1):
        problems.append(where.entry(ds.id).problem(
            "end_step", f"{_label(ds)}: end_step {ds.end_step} is before start_step "
            f"{ds.start_step}, so it would never be drawn; raise end_step or lower start_step"))


def _check_against_training(datasets: list[DatasetConfig], training: TrainingConfig,
                            where: Location, problems: list[Problem]) -> None:
    for ds in datasets:
        if ds.is_regularisation_data and training.model_type != "lora":
            problems.append(where.entry(ds.id).problem(
                "is_regularisation_data", f"{_label(ds)}: is_regularisation_data takes the base "
                "model's prediction as the target, which needs model_type 'lora' (the adapter "
                f"turned off); model_type is '{training.model_type}'. Train a LoRA, or remove "
                "is_regularisation_data."))
        steps, epochs = training.max_train_steps, training.num_train_epochs
        if steps is not None and ds.start_step > steps:
            problems.append(where.entry(ds.id).problem(
                "start_step", f"{_label(ds)}: start_step {ds.start_step} is after the last step "
                f"(max_train_steps {steps}), so it would never be trained; lower start_step or "
                "raise max_train_steps"))
        if steps is None and epochs is not None and ds.start_epoch > epochs:
            problems.append(where.entry(ds.id).problem(
                "start_epoch", f"{_label(ds)}: start_epoch {ds.start_epoch} is after the last "
                f"epoch (num_train_epochs {epochs}), so it would never be trained; lower "
                "start_epoch or raise num_train_epochs"))
