"""`python -m simpletuner.audit --config CONFIG --output DIR [--epochs N]`: exactly-once, checked.

Launched like training (plain python = one process; `accelerate launch` or `torchrun` = N), it
runs the real start-up and sampler for N epochs without loading a model. Each rank writes
``DIR/rank-<k>.jsonl``; the main rank writes ``DIR/plan.json`` (seed, data-parallel groups,
context_parallel_size, buckets, each epoch's trimmed and carried occurrences), checks the traces
against it (the ranks of a context-parallel group alike, every sample exactly once across the
groups) and prints one line per epoch. With ``dataset_type: eval`` datasets it does the same for
one evaluation, as the trainer walks it, in ``DIR/eval/``. Every rank exits with the same
status: 0 when nothing is missing or duplicated.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.common.clean_exit import exit_process
from simpletuner.common.atomic import atomic_write_json
from simpletuner.dataset_kinds import kind_of
from simpletuner.helpers.metadata.backends.base import IndexAgreementError
from simpletuner.helpers.metadata.mesh import Mesh
from simpletuner.helpers.metadata.split import UndersizedBucketsError
from simpletuner.helpers.metadata.startup import (DataStartup, DataStartupError, build_sampler,
                                                  start_data)
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, NoDatasetError
from simpletuner.helpers.multiaspect.trace import TraceWriter, read_trace
from simpletuner.helpers.multiaspect.verify import Leftovers, build_plan, verify
from simpletuner.common.together import RankFailure, failing_together

logger = logging.getLogger("simpletuner.audit")

# Errors that every rank raises alike (from data every rank has, or agreed by failing_together):
# report them, exit non-zero.
SHARED_ERRORS = (ConfigError, DataStartupError, IndexAgreementError, UndersizedBucketsError,
                 NoDatasetError, RankFailure)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simpletuner.audit", description=__doc__)
    parser.add_argument("--config", default="config/config.json")
    parser.add_argument("--output", required=True, help="folder for rank traces and plan.json")
    parser.add_argument("--epochs", type=int, default=1)
    return parser


def audit_plan(startup: DataStartup, sampler: MultiAspectSampler, epochs: int) -> dict:
    """What should happen, from the metadata backends' split (not from the sampler's run);
    which epochs hold a dataset is the sampler's timeline, which verify re-derives."""
    trimmed: Leftovers = {}
    carried: Leftovers = {}
    specs = []
    for d in sampler.datasets:
        dataset_id = d.index.dataset_id
        backend = startup.backends[dataset_id]
        specs.append(backend.split_spec(d.index))
        for epoch in range(epochs):
            entry = sampler.timeline.entry(epoch)  # no pieces where it has not joined or ended
            first_epoch = entry.first_epochs.get(dataset_id) if dataset_id in entry.joins else None
            pieces = {} if first_epoch is None else backend.split_buckets_between_processes(
                d.index, seed=sampler.seed, epoch=epoch, processes=sampler.processes, rank=0,
                accumulation=sampler.accumulation, first_epoch=first_epoch)
            trimmed.setdefault(epoch, {})[dataset_id] = {k: p.trimmed for k, p in pieces.items()}
            carried.setdefault(epoch, {})[dataset_id] = {k: p.carried for k, p in pieces.items()}
    return build_plan(seed=sampler.seed, world_size=sampler.processes,
                      context_parallel=sampler.context_parallel,
                      accumulation=sampler.accumulation, datasets=specs, trimmed=trimmed,
                      carried=carried,
                      schedules={d.index.dataset_id: d.schedule for d in sampler.datasets},
                      references={d.index.dataset_id: {s: list(refs) for s, refs in
                                                       d.index.references.items()}
                                  for d in sampler.datasets})


def _trace(sampler: MultiAspectSampler, output: Path, rank: int, epochs: int) -> None:
    group = sampler.rank if sampler.context_parallel > 1 else None  # the rank's dp group
    with TraceWriter(output, rank, group=group) as writer:
        for _ in range(epochs):
            for batch in sampler:
                writer.write(batch)


def _check(output: Path, world_size: int, plan: dict, label: str) -> bool:
    try:
        traces = {rank: read_trace(output, rank) for rank in range(world_size)}
    except ValueError as exc:
        print(f"audit FAILED: {exc}")
        return False
    report = verify(plan, traces)
    for line in report.lines():
        print(f"{label}{line}")
    return report.ok


def _audit_sampler(accelerator: Accelerator, startup: DataStartup, sampler: MultiAspectSampler,
                   output: Path, epochs: int, label: str) -> bool:
    """Plan, trace every rank, check: each step that runs on some ranks only, or can fail on
    one, is a ``failing_together`` block, so its error reaches every rank before the next
    collective."""
    main = accelerator.is_main_process
    plan = None
    with failing_together(f"writing {output / 'plan.json'}"):
        if main:
            plan = audit_plan(startup, sampler, epochs)
            atomic_write_json(output / "plan.json", plan, indent=1)
            mesh = Mesh(accelerator.num_processes, sampler.context_parallel)
            print(f"{label}seed {sampler.seed}, {mesh.describe()}, "
                  f"{sampler.micro_batches_in(0)} micro-batches per rank in epoch 0, {epochs} "
                  "epochs")
    with failing_together("writing the rank traces"):  # also the barrier before the check
        _trace(sampler, output, accelerator.process_index, epochs)
    ok = False
    with failing_together("checking the traces"):
        if main:
            ok = _check(output, accelerator.num_processes, plan, label)
    (ok,) = broadcast_object_list([ok])
    return ok


def _audit(accelerator: Accelerator, config_path: str, output: Path, epochs: int) -> bool:
    """The training datasets for ``epochs`` epochs, then the evaluation datasets (if any) for
    the one epoch every evaluation walks."""
    config = load_configuration(config_path)
    startup = start_data(config, accelerator, seed=config.training.seed)
    sampler = build_sampler(startup, config.training, accelerator)
    # One line per rank, so a log shows that every rank runs with the same seed and length.
    print(f"[rank {accelerator.process_index}] seed {sampler.seed}, "
          f"{sampler.micro_batches_in(0)} micro-batches in epoch 0", file=sys.stderr)
    ok = _audit_sampler(accelerator, startup, sampler, output, epochs, "")
    if any(kind_of(ds).evaluates for ds in config.datasets):
        evaluation = build_sampler(startup, config.training, accelerator, evaluation=True)
        ok = _audit_sampler(accelerator, startup, evaluation, output / "eval", 1,
                            "evaluation ") and ok
    return ok


def run_audit(accelerator: Accelerator, config_path: str, output: Path, epochs: int) -> int:
    try:
        return 0 if _audit(accelerator, config_path, output, epochs) else 1
    except SHARED_ERRORS as exc:
        print(f"[rank {accelerator.process_index}] audit stopped: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.epochs < 1:
        print("--epochs must be at least 1", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    # Built before anything touches PartialState, so CPU runs get gloo and the real world size.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    try:
        return run_audit(accelerator, args.config, Path(args.output).resolve(), args.epochs)
    finally:
        accelerator.end_training()


if __name__ == "__main__":
    exit_process(main())
