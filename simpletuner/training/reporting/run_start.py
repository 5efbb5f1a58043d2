"""What the run log records when a run starts (main rank): the settings, each dataset's
buckets after caching, the effective batch, the files skipped (their counts in the event log)
and, with ``trace_samples``, the plan of the epochs
the run trains, for the report's exactly-once check."""

from __future__ import annotations

from pathlib import Path

from simpletuner.audit import audit_plan
from simpletuner.training.reporting.report_page import render_report
from simpletuner.training.reporting.run_log import RunLog, shown_settings


def new_run_log(output_dir: Path, *, main: bool) -> RunLog:
    """The run's log, rendering the report page from what is on disk."""
    return RunLog(output_dir, main=main, render=render_report)


def epochs_covering(sampler, total_steps: int) -> int:
    """How many epochs (from epoch 0) the run's ``total_steps`` optimizer steps reach into."""
    epochs, steps = 0, 0
    while steps < total_steps:
        in_epoch = sampler.micro_batches_in(epochs) // sampler.accumulation
        if in_epoch == 0:
            break
        steps += in_epoch
        epochs += 1
    return max(epochs, 1)


def start_run_log(run_log: RunLog, *, training, data, sampler, indexes, skipped: dict,
                  total_steps: int, processes: int) -> None:
    """``skipped``: dataset id -> [{path, reason}], as skipped_files.json holds it."""
    if not run_log.writing:
        return
    buckets = {dataset_id: {key: len(ids) for key, ids in index.buckets.items()}
               for dataset_id, index in sorted(indexes.items())}
    run_log.start(total_steps=total_steps, settings=shown_settings(training, processes),
                  buckets=buckets, world_size=processes,
                  effective_batch=(training.train_batch_size * sampler.accumulation
                                   * sampler.processes))  # data-parallel groups
    run_log.events.skip(run_log.status["step"], skipped)
    if training.trace_samples:
        run_log.write_plan(Path(training.output_dir) / "trace",
                           lambda: audit_plan(data, sampler, epochs_covering(sampler, total_steps)))
