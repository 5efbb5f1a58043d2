"""Data start-up shared by training and the audit: index every dataset, agree, resolve the seed.

Every rank makes the same calls in the same order, so none waits alone in a collective:

1. the main rank refreshes each dataset's index (discovery, cache write) and broadcasts the
   outcome, success or the error text, so a failure stops every rank with the same message;
2. the other ranks load the cached index;
3. the ranks compare index digests in one gather (a rank's load error travels with it), then
   each keeps a dataset's ``max_num_samples`` subset (pure: the same on every rank);
4. bucket sizes are checked against ``E`` (pure: same data everywhere, same error everywhere);
5. the shared seed is resolved: the configured one, else drawn on the main rank and broadcast.

The trainer then caches (which may drop undecodable samples from the index on every rank with
``DatasetIndex.without``), calls ``build_sampler`` with the final indexes, and on every rank
``report_skipped_files_together``: the main rank names every file left out and why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from accelerate.utils import broadcast_object_list

from simpletuner.configuration import ConfigError, Configuration, TrainingConfig
from simpletuner.common.atomic import atomic_write_json
from simpletuner.common.names import printable
from simpletuner.common.peer_watch import in_collective
from simpletuner.common.together import failing_together
from simpletuner.helpers.metadata.backends.base import MetadataBackend
from simpletuner.helpers.metadata.index import DatasetIndex
from simpletuner.helpers.metadata.mesh import Mesh, mesh_problem
from simpletuner.helpers.metadata.pairs import pair_datasets, pair_summary
from simpletuner.helpers.metadata.split import check_bucket_sizes
from simpletuner.helpers.metadata.subset import limit_samples
from simpletuner.helpers.metadata.video_buckets import retiming_summary
from simpletuner.helpers.multiaspect.captions import CaptionPolicy
from simpletuner.helpers.multiaspect.dataset_schedule import DatasetSchedule
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, SamplerDataset

logger = logging.getLogger(__name__)

SKIPPED_FILES = "skipped_files.json"
SKIPPED_NAMED_IN_LOG = 20
# reason -> {count, first names} per dataset: what the run report shows, without reading the list
SKIPPED_SUMMARY = "skipped_summary.json"
SKIPPED_NAMED_PER_REASON = 5


class DataStartupError(RuntimeError):
    """Raised with the same message on every rank."""


@dataclass
class DataStartup:
    backends: dict[str, MetadataBackend]   # dataset id -> backend, in config order
    indexes: dict[str, DatasetIndex]       # identical on every rank (checked)
    seed: int                              # the shared shuffle seed; record it to reproduce
    seed_generated: bool                   # True when drawn because config.json has no seed
    notes: list[str]                       # e.g. buckets extended by oversubscription
    # conditioning dataset id -> its index, orphans skipped (its references: the targets')
    references: dict[str, DatasetIndex] = field(default_factory=dict)

    def conditioning(self, configs) -> dict[str, tuple]:
        """Conditioning dataset id -> (its DatasetConfig of ``configs``, its paired index)."""
        return {ds.id: (ds, self.references[ds.id]) for ds in configs}


def _refresh_on_main(backends: dict[str, MetadataBackend], accelerator) -> dict[str, DatasetIndex]:
    indexes: dict[str, DatasetIndex] = {}
    error = None
    if accelerator.is_main_process:
        try:
            for dataset_id, backend in backends.items():
                indexes[dataset_id] = backend.refresh_index(show_progress=True)
        except Exception as exc:  # any failure must reach the other ranks, not strand them
            if not isinstance(exc, OSError):  # an OSError names its file: its line says all
                logger.exception("discovery failed on the main process")
            error = f"discovery failed on the main process: {type(exc).__name__}: {exc}"
    with in_collective("discovery's outcome from the main process"):
        (error,) = broadcast_object_list([error])
    if error is not None:
        raise DataStartupError(error)
    return indexes


def _load_elsewhere(backends: dict[str, MetadataBackend], accelerator,
                    indexes: dict[str, DatasetIndex]) -> tuple[dict[str, DatasetIndex], str | None]:
    if accelerator.is_main_process:
        return indexes, None
    try:
        return {dataset_id: b.load_index() for dataset_id, b in backends.items()}, None
    except Exception as exc:  # reported by every rank after the agreement gather
        return {}, f"{type(exc).__name__}: {exc}"


def start_data(config: Configuration, accelerator, *, seed: int | None) -> DataStartup:
    """Index, agree, check and seed; ``accelerator`` is an accelerate Accelerator (or state).
    ``seed``: the configured seed (or a resumed run's); None = drawn on the main rank."""
    mesh = run_mesh(config.training, accelerator.num_processes)
    every = {ds.id: MetadataBackend.from_config(ds, config.training)
             for ds in (*config.datasets, *config.references)}
    indexes = _refresh_on_main(every, accelerator)
    indexes, load_error = _load_elsewhere(every, accelerator, indexes)
    MetadataBackend.check_index_agreement(indexes, load_error, accelerator)
    indexes, references = pair_datasets(config.datasets, indexes)
    backends = {ds.id: every[ds.id] for ds in config.datasets}
    indexes = {i: limit_samples(index, backends[i].dataset.max_num_samples)
               for i, index in indexes.items()}
    notes = check_bucket_sizes(
        [backends[i].split_spec(index) for i, index in indexes.items()],
        mesh.data_parallel, config.training.gradient_accumulation_steps)
    shared_seed = MetadataBackend.resolve_shared_seed(seed, accelerator)
    if accelerator.is_main_process:
        for note in notes:
            logger.info(note)
        for index in indexes.values():  # which clips video.fps re-timed, from which rates
            if (retimed := retiming_summary(index)) is not None:
                logger.info(retimed)
        for ds in config.datasets:  # the orphans of edit pairs, counted (skipped_files names them)
            if ds.conditioning_ids():
                logger.info(pair_summary(indexes[ds.id], [references[c] for c in
                                                         ds.conditioning_ids()]))
    return DataStartup(backends, indexes, shared_seed, seed is None, notes, references)


def build_sampler(startup: DataStartup, training: TrainingConfig, accelerator, *,
                  indexes: dict[str, DatasetIndex] | None = None,
                  evaluation: bool = False) -> MultiAspectSampler:
    """This rank's sampler over ``indexes`` (default: the start-up ones; pass the post-cache ones)."""
    final = startup.indexes if indexes is None else indexes
    datasets = []
    for dataset_id, index in final.items():
        backend = startup.backends[dataset_id]
        spec = backend.split_spec(index)
        datasets.append(SamplerDataset(index, backend.caption_for, spec.batch_size, spec.repeats,
                                       spec.evaluation, spec.allow_oversubscription,
                                       CaptionPolicy.for_dataset(backend.dataset),
                                       spec.bucket_tail, DatasetSchedule.of(backend.dataset),
                                       backend.index_version()))
    mesh = run_mesh(training, accelerator.num_processes)
    return MultiAspectSampler(
        datasets, seed=startup.seed, processes=mesh.data_parallel,
        rank=mesh.group_of(accelerator.process_index),
        accumulation=training.gradient_accumulation_steps, evaluation=evaluation,
        sampling=training.data_backend_sampling,
        context_parallel=mesh.context_parallel)


def run_mesh(training: TrainingConfig, processes: int) -> Mesh:
    """The run's mesh of ``processes`` (those the launcher started). Every rank calls it before
    any collective, so a context_parallel_size that does not divide them is the same
    ConfigError on every rank."""
    problem = mesh_problem(processes, training.context_parallel_size)
    if problem:
        raise ConfigError([problem])
    return Mesh(processes, training.context_parallel_size)


def skipped_files(indexes: Mapping[str, DatasetIndex]) -> dict[str, Sequence[dict]]:
    """Dataset id -> [{path, reason}] of every file skipped, as skipped_files.json holds it
    (read a slice at a time: a table may name millions of absent files)."""
    return {dataset_id: index.skipped.entries()
            for dataset_id, index in sorted(indexes.items())}


def report_skipped_files(indexes: Mapping[str, DatasetIndex], output_dir: Path) -> Path:
    """Write every skipped file with its reason to ``output_dir/skipped_files.json`` (dataset id
    -> [{path, reason}]), entry by entry (millions of absent files never one list or text), its
    summary by reason to SKIPPED_SUMMARY, and log the first few; returns the list's path."""
    path = Path(output_dir) / SKIPPED_FILES
    # rewritten each run: never an old run's list
    atomic_write_json(path, skipped_files(indexes))
    atomic_write_json(Path(output_dir) / SKIPPED_SUMMARY, {
        dataset_id: index.skipped.summary(SKIPPED_NAMED_PER_REASON)
        for dataset_id, index in indexes.items()}, indent=1)
    total = sum(len(index.skipped) for index in indexes.values())
    named = [f"  {dataset_id}: {printable(skip.path)}: {skip.reason}"
             for dataset_id, index in sorted(indexes.items())
             for skip in index.skipped[:SKIPPED_NAMED_IN_LOG]][:SKIPPED_NAMED_IN_LOG]
    if not total:
        logger.info("no file was skipped (%s)", path)
    else:
        more = total - len(named)
        logger.warning("%d files were skipped and are not trained on:\n%s%s\nthe full list: %s",
                       total, "\n".join(named), f"\n  ... and {more} more" if more > 0 else "",
                       path)
    return path


def report_skipped_files_together(indexes: Mapping[str, DatasetIndex], output_dir: Path,
                                  accelerator) -> Path:
    """Every rank calls this: the main rank writes and logs the report (report_skipped_files)
    in a failing_together block, so a failed write stops every rank, none is left waiting in
    the next collective. Returns the report's path, on every rank."""
    path = Path(output_dir) / SKIPPED_FILES
    with failing_together(f"writing {path}"):
        if accelerator.is_main_process:
            report_skipped_files(indexes, output_dir)
    return path
