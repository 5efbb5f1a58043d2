"""Checks that read only the configuration and the filesystem: no torch, no model, no collective.

``python -m simpletuner check`` (what ./train.sh runs before starting accelerate) reports them,
so such a mistake prints its report alone and not inside the launcher's traceback; the preflight
runs static_problems again on every rank, for runs started with accelerate launch directly.
"""

from __future__ import annotations

import re
from pathlib import Path

from simpletuner.configuration import Configuration
from simpletuner.configuration.errors import DATASETS, Location, Problem
from simpletuner.configuration.validation_options import validation_sizes
from simpletuner.helpers.data_backend.huggingface_loading import dataset_problems
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.pairs import pair_references
from simpletuner.helpers.metadata.split import UndersizedBucketsError, check_bucket_sizes
from simpletuner.helpers.metadata.subset import limit_samples
from simpletuner.models.block_count import (TRAINED_SUBFOLDER, attention_heads,
                                            swappable_block_count)
from simpletuner.models.model_path import family_folder_problem, model_path_problem
from simpletuner.training.run.adapter_checks import adapter_problems, assistant_warnings
from simpletuner.training.run.dataset_folders import output_dir_problems, shared_folder_warnings
from simpletuner.training.run.output_dir_lock import OutputDirLock
from simpletuner.training.reporting.trackers import tracker_problems

# Any folder named like a checkpoint, complete or not, is evidence of an earlier run.
_CHECKPOINT_NAME = re.compile(r"^checkpoint-\d+$")


def launch_problems(configuration: Configuration) -> list[Problem]:
    """``check``'s: static_problems, an output_dir locked by a run that is still going (the
    preflight runs inside the run's own lock, so it cannot ask the lock this), and buckets
    too small for the effective batch that an earlier run's index cache already shows."""
    problems = static_problems(configuration)
    in_use = OutputDirLock(Path(configuration.training.output_dir)).in_use_problem()
    if in_use:
        problems.append(Location(str(configuration.config_path)).problem(
            "output_dir", f"key 'output_dir': {in_use}"))
    if not problems:  # the index caches are read only for a config that is otherwise sound
        problems += cached_bucket_problems(configuration)
    return problems


def cached_bucket_problems(configuration: Configuration) -> list[Problem]:
    """Undersized buckets of the folder datasets whose index cache holds every listed file's
    header, after pairing edit targets with their references as start-up does (a target
    without its reference is not trained); a dataset without one, or with a reference dataset
    without one, is left to the run, which reports the same (status 2)."""
    training, specs = configuration.training, []
    cached = _cached_indexes([*configuration.datasets, *configuration.references], training)
    for dataset in configuration.datasets:
        conditioning = dataset.conditioning_ids()
        if dataset.id not in cached or not all(c in cached for c in conditioning):
            continue
        backend, index = cached[dataset.id]
        if conditioning:
            index = pair_references(index, [cached[c][1] for c in conditioning]).target
        specs.append(backend.split_spec(limit_samples(index, dataset.max_num_samples)))
    try:
        # over the data-parallel groups (context_parallel_size divides num_processes: checked)
        check_bucket_sizes(specs, training.num_processes // training.context_parallel_size,
                           training.gradient_accumulation_steps)
    except UndersizedBucketsError as exc:
        backend = training.data_backend_config
        shown = f"{backend} (as its index cache in output_dir shows)"
        return [Location(backend, DATASETS, shown).problem("", str(exc))]
    return []


def _cached_indexes(datasets: list, training) -> dict[str, tuple[MetadataBackend, DatasetIndex]]:
    """Dataset id -> its backend and cached index, for the local folders that have one (remote
    listings and tables are read by the run, not by check)."""
    cached = {}
    for dataset in datasets:
        if dataset.type != "local" or dataset.metadata_backend != "discovery":
            continue
        backend = MetadataBackend.from_config(dataset, training)
        index = backend.index_if_cached()
        if index is not None:
            cached[dataset.id] = backend, index
    return cached


def launch_warnings(configuration: Configuration) -> list[str]:
    """What will work, but cost more than the config's author probably expects (``check``
    prints them, and the main process again at start-up)."""
    return shared_folder_warnings(configuration) + assistant_warnings(configuration.training)


def static_problems(configuration: Configuration) -> list[Problem]:
    """Every problem the config and the filesystem show, each naming the file it is in
    (config.json, or the dataset file for a type 'huggingface' dataset that does not open)."""
    training = configuration.training
    where = Location(str(configuration.config_path))
    problems: list[Problem] = []
    if training.max_train_steps is None and training.num_train_epochs is None:
        problems.append(where.problem(
            "max_train_steps", "set 'max_train_steps' or 'num_train_epochs' (how long to train)"))
    alignment = training.aspect_bucket_alignment
    if any(side % alignment for size in validation_sizes(training.validation_resolution)
           for side in size):
        problems.append(where.problem(
            "validation_resolution", "key 'validation_resolution' is "
            f"{training.validation_resolution!r}; each side must be a multiple of "
            f"aspect_bucket_alignment ({alignment})"))
    if training.model_type == "lora" and training.lora_target_modules == []:
        problems.append(where.problem(
            "lora_target_modules", "key 'lora_target_modules' is an empty list; name the modules "
            "to adapt, or leave it unset for the family's defaults"))
    problems += adapter_problems(training, where)
    problems += [where.problem("report_to", problem)
                 for problem in tracker_problems(training.report_to)]
    model_problem = (model_path_problem(training.pretrained_model_name_or_path)
                     or family_folder_problem(training.model_family,
                                              training.pretrained_model_name_or_path))
    if model_problem:
        problems.append(where.problem(
            "pretrained_model_name_or_path", "key 'pretrained_model_name_or_path': "
            f"{model_problem}"))
    problems += (output_dir_problems(configuration) + block_swap_problems(training, where)
                 + attention_head_problems(training, where))
    fresh_problem = fresh_run_problem(training.resume_from_checkpoint, Path(training.output_dir))
    if fresh_problem:
        problems.append(where.problem("resume_from_checkpoint", fresh_problem))
    return problems + huggingface_problems(configuration)


def attention_head_problems(training, where: Location) -> list[Problem]:
    """context_parallel_size against the heads the model folder's config.json shows (checked
    again on the loaded network, for a built-in model not built yet)."""
    size = training.context_parallel_size
    heads = attention_heads(training.model_family, training.pretrained_model_name_or_path)
    if size == 1 or heads is None or heads % size == 0:
        return []
    return [where.problem(
        "context_parallel_size", f"context_parallel_size {size} does not divide the "
        f"{heads} attention heads of the model's {TRAINED_SUBFOLDER}: each rank of a "
        "context-parallel group attends with heads / context_parallel_size of them",
        f"use a context_parallel_size that divides {heads}")]


def block_swap_problems(training, where: Location) -> list[Problem]:
    """musubi_blocks_to_swap beyond the blocks the model folder's config.json shows (checked
    again on the loaded network, for a built-in model not built yet)."""
    count = training.musubi_blocks_to_swap
    if not count:
        return []
    most = swappable_block_count(training.model_family, training.pretrained_model_name_or_path)
    if most is None or count <= most:
        return []
    return [where.problem(
        "musubi_blocks_to_swap", f"key 'musubi_blocks_to_swap' is {count}, but the model's "
        f"{TRAINED_SUBFOLDER} has {most} blocks to swap", f"set it to {most} or less")]


def huggingface_problems(configuration: Configuration) -> list[Problem]:
    """Each ``type: huggingface`` dataset opens (offline), with its split and columns."""
    found = []
    for dataset in configuration.datasets:
        if dataset.type == "huggingface":
            where = configuration.dataset_file.entry(dataset.id, f"dataset (id '{dataset.id}')")
            found += [where.problem("huggingface", problem)
                      for problem in dataset_problems(dataset)]
    return found


def earlier_run_checkpoints(output_dir: Path) -> list[str]:
    """Names of the checkpoint-<step> folders in output_dir, by step."""
    if not output_dir.is_dir():
        return []
    names = [c.name for c in output_dir.iterdir() if _CHECKPOINT_NAME.match(c.name) and c.is_dir()]
    return sorted(names, key=lambda name: int(name.split("-")[1]))


def fresh_run_problem(resume_from_checkpoint: str | None, output_dir: Path) -> str | None:
    """A run that does not resume must not start over an earlier run's checkpoints: it would
    overwrite some, and a later 'latest' would pick up the old run's."""
    if resume_from_checkpoint is not None:
        return None
    found = earlier_run_checkpoints(output_dir)
    if not found:
        return None
    shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
    return (f"key 'resume_from_checkpoint' is not set, but output_dir {output_dir} holds an "
            f"earlier run's checkpoints ({shown}). Set resume_from_checkpoint to 'latest' to "
            "continue that run, or use a new or emptied output_dir to start a fresh one")
