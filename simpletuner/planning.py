"""`python -m simpletuner plan`: validate the config, discover every dataset, show the buckets."""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict
from pathlib import Path

from simpletuner.common.atomic import json_text
from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.pairs import pair_datasets, pair_summary
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.mesh import mesh_problem
from simpletuner.helpers.metadata.sizing import sizing_table, split_sizing
from simpletuner.helpers.metadata.subset import limit_samples
from simpletuner.helpers.metadata.video_buckets import retiming_summary
from simpletuner.helpers.multiaspect.schedule_report import (dataset_schedule,
                                                             schedule_first_epochs,
                                                             schedule_table)
from simpletuner.plan_report import (bucket_table, skip_summary, undersized_buckets,
                                     write_histogram)

logger = logging.getLogger("simpletuner.plan")

HISTOGRAM_NAME = "bucket_histogram.png"


def _refresh_line(dataset, report, index: DatasetIndex) -> str:
    """What discovery did: where each size came from, counting only what happened (a first
    run reuses nothing; a table's sizes are neither read nor cached)."""
    kind = kind_of(dataset)
    sources = [f"{report.read} {kind.probe_noun}"]
    if report.tabled:
        sources.append(f"{report.tabled} sized by the table")
    if report.reused:
        sources.append(f"{report.reused} reused from cache")
    return (f"dataset '{dataset.id}': {report.listed} {kind.sample_noun} files, "
            f"{', '.join(sources)}, {index.sample_count} {kind.sample_noun}s in "
            f"{len(index.buckets)} buckets, {len(index.skipped)} skipped")


def _plan_json(indexes: list[DatasetIndex]) -> dict:
    return {"datasets": {
        index.dataset_id: {
            "buckets": {key: list(ids) for key, ids in index.buckets.items()},
            "skipped": [{"path": s.path, "reason": s.reason} for s in index.skipped],
            # a video dataset's: what each clip's latents are cached from
            # (retimed_fps only where set: video.fps)
            **({"clips": {s: {k: v for k, v in asdict(plan).items() if v is not None}
                          for s, plan in index.clips.items()}} if index.clips else {}),
        }
        for index in indexes
    }}


def run_plan(config_path: str, *, as_json: bool = False, num_processes: int | None = None,
             context_parallel: int | None = None) -> int:
    """Exit code: 0 fine, 1 a dataset cannot be used or discovery failed, 2 bad configuration.

    Logs and progress bars go to stderr; stdout holds the tables, or only JSON with ``as_json``.
    """
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        config = load_configuration(config_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if num_processes is not None and num_processes < 1:
        print(f"--num-processes is {num_processes}; expected 1 or more", file=sys.stderr)
        return 2
    # The data-parallel groups the split is over (helpers/metadata/mesh.py).
    context = context_parallel or config.training.context_parallel_size
    problem = mesh_problem(num_processes or config.training.num_processes, context)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        indexes, split_specs = _index_datasets(config)
    except OSError as exc:  # the dataset is named in the message
        print(exc, file=sys.stderr)
        return 1

    processes = (num_processes or config.training.num_processes) // context
    _write_histogram(config, indexes, split_specs, processes)

    # --num-processes: what the split would keep and trim on that many hypothetical ranks.
    sizing = None
    if num_processes is not None:
        sizing = split_sizing(split_specs, processes,
                              config.training.gradient_accumulation_steps,
                              schedule_first_epochs(config.datasets, split_specs, processes,
                                                    config.training.gradient_accumulation_steps,
                                                    config.training.seed,
                                                    config.training.data_backend_sampling),
                              context)
    schedule = dataset_schedule(config.datasets, split_specs, processes,
                                config.training.gradient_accumulation_steps,
                                config.training.max_train_steps,
                                config.training.num_train_epochs, config.training.seed,
                                config.training.data_backend_sampling)
    _print_plan(indexes, sizing, as_json, (schedule, processes,
                                           config.training.gradient_accumulation_steps))
    if sizing is not None and sizing["problem"]:
        print(sizing["problem"], file=sys.stderr)
        return 1
    empty = [index.dataset_id for index in indexes if index.sample_count == 0]
    for dataset_id in empty:
        print(f"dataset '{dataset_id}' has no usable image; see the skipped files above "
              "or fix instance_data_dir", file=sys.stderr)
    return 1 if empty else 0


def _write_histogram(config, indexes: list[DatasetIndex], split_specs: list,
                     processes: int) -> None:
    """The bucket histogram, undersized buckets (which cannot fill one effective batch on the
    planned or configured data-parallel groups) marked."""
    undersized = {spec.dataset_id: undersized_buckets(
        spec, processes, config.training.gradient_accumulation_steps) for spec in split_specs}
    histogram = Path(config.training.output_dir) / HISTOGRAM_NAME
    write_histogram(indexes, histogram, undersized)
    marked = sum(len(keys) for keys in undersized.values())
    logger.info("bucket histogram: %s (%d buckets marked '< E': too small for the effective "
                "batch on %d processes)", histogram, marked, processes)


def _index_datasets(config) -> tuple[list[DatasetIndex], list]:
    """Each dataset's index (refreshed: discovery runs here) and split spec, logged."""
    indexes: list[DatasetIndex] = []
    split_specs = []
    backends, found = {}, {}
    for dataset in (*config.datasets, *config.references):
        backends[dataset.id] = MetadataBackend.from_config(dataset, config.training)
        try:
            found[dataset.id] = backends[dataset.id].refresh_index(show_progress=True)
        except OSError as exc:
            raise OSError(f"dataset '{dataset.id}': discovery failed: {exc}") from exc
    paired, references = pair_datasets(config.datasets, found)
    for dataset in config.datasets:
        backend = backends[dataset.id]
        index = limit_samples(paired[dataset.id], dataset.max_num_samples)
        if dataset.conditioning_ids():
            logger.info(pair_summary(index, [references[c] for c in dataset.conditioning_ids()]))
        logger.info(_refresh_line(dataset, backend.last_refresh, index))
        if (retimed := retiming_summary(index)) is not None:
            logger.info(retimed)
        indexes.append(index)
        split_specs.append(backend.split_spec(index))
    return indexes, split_specs


def _print_plan(indexes: list[DatasetIndex], sizing: dict | None, as_json: bool,
                schedule: tuple[dict, int, int]) -> None:
    """stdout: the bucket tables, the schedule (and the split on --num-processes), or only
    JSON."""
    if as_json:
        output = _plan_json(indexes)
        output["schedule"] = schedule[0]
        if sizing is not None:
            output["split"] = sizing
        print(json_text(output, indent=2))  # keys sorted; file names that are not UTF-8 escaped
        return
    for index in indexes:
        print(f"\ndataset '{index.dataset_id}'")
        print(bucket_table(index))
        print(skip_summary(index))
    print()
    print(schedule_table(*schedule))
    if sizing is not None:
        print()
        print(sizing_table(sizing))
