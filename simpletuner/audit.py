"""`python -m simpletuner.audit --config CONFIG --output DIR [--epochs N]`: exactly-once, checked.

Launched like training (plain python = one process; `accelerate launch` or `torchrun` = N), it
runs the real start-up and sampler for N epochs without loading a model. Each rank writes
``DIR/rank-<k>.jsonl``; the main rank writes ``DIR/plan.json`` (seed, world size, buckets, each
epoch's trimmed occurrences), checks the traces against it and prints one line per epoch. Every
rank exits with the same status: 0 when nothing is missing or duplicated.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list, gather_object

from simpletuner.configuration import ConfigError, load_configuration
from simpletuner.helpers.data_backend.atomic import atomic_write_json
from simpletuner.helpers.metadata.backends.base import IndexAgreementError
from simpletuner.helpers.metadata.split import UndersizedBucketsError
from simpletuner.helpers.metadata.startup import (DataStartup, DataStartupError, build_sampler,
                                                  start_data)
from simpletuner.helpers.multiaspect.sampler import MultiAspectSampler, NoDatasetError
from simpletuner.helpers.multiaspect.trace import TraceWriter, read_trace
from simpletuner.helpers.multiaspect.verify import build_plan, verify

logger = logging.getLogger("simpletuner.audit")

# Errors that every rank detects alike from data every rank has: report them, exit non-zero.
SHARED_ERRORS = (ConfigError, DataStartupError, IndexAgreementError, UndersizedBucketsError,
                 NoDatasetError)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simpletuner.audit", description=__doc__)
    parser.add_argument("--config", default="config/config.json")
    parser.add_argument("--output", required=True, help="folder for rank traces and plan.json")
    parser.add_argument("--epochs", type=int, default=1)
    return parser


def _plan(startup: DataStartup, sampler: MultiAspectSampler, epochs: int) -> dict:
    """What should happen, from the metadata backends' split (not from the sampler's run)."""
    trimmed: dict[int, dict[str, dict[str, list[str]]]] = {}
    specs = []
    for d in sampler.datasets:
        dataset_id = d.index.dataset_id
        backend = startup.backends[dataset_id]
        specs.append(backend.split_spec(d.index))
        for epoch in range(epochs):
            pieces = backend.split_buckets_between_processes(
                d.index, seed=sampler.seed, epoch=epoch, processes=sampler.processes, rank=0,
                accumulation=sampler.accumulation)
            trimmed.setdefault(epoch, {})[dataset_id] = {k: p.trimmed for k, p in pieces.items()}
    return build_plan(seed=sampler.seed, world_size=sampler.processes,
                      accumulation=sampler.accumulation, datasets=specs, trimmed=trimmed)


def _trace(sampler: MultiAspectSampler, output: Path, rank: int, epochs: int) -> str | None:
    """Write this rank's trace; an error is returned so every rank can hear of it."""
    try:
        with TraceWriter(output, rank) as writer:
            for _ in range(epochs):
                for batch in sampler:
                    writer.write(batch)
    except OSError as exc:
        return f"rank {rank} could not write its trace: {exc}"
    return None


def _check(output: Path, world_size: int, plan: dict) -> bool:
    try:
        traces = {rank: read_trace(output, rank) for rank in range(world_size)}
    except ValueError as exc:
        print(f"audit FAILED: {exc}")
        return False
    report = verify(plan, traces)
    for line in report.lines():
        print(line)
    return report.ok


def run_audit(accelerator: Accelerator, config_path: str, output: Path, epochs: int) -> int:
    rank, main = accelerator.process_index, accelerator.is_main_process
    try:
        config = load_configuration(config_path)
        startup = start_data(config, accelerator)
        sampler = build_sampler(startup, config.training, accelerator)
    except SHARED_ERRORS as exc:
        print(f"[rank {rank}] audit stopped: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    # One line per rank, so a log shows that every rank runs with the same seed and length.
    print(f"[rank {rank}] seed {sampler.seed}, {len(sampler)} micro-batches per epoch",
          file=sys.stderr)
    plan = None
    if main:
        plan = _plan(startup, sampler, epochs)
        atomic_write_json(output / "plan.json", plan, indent=1)
        print(f"seed {sampler.seed}, {sampler.processes} processes, {len(sampler)} micro-batches "
              f"per rank per epoch, {epochs} epochs")
    # The gather doubles as the barrier before the check and tells every rank of any failure.
    errors = [e for e in gather_object([_trace(sampler, output, rank, epochs)]) if e]
    ok = False
    if main:
        for error in errors:
            print(f"audit FAILED: {error}")
        ok = not errors and _check(output, sampler.processes, plan)
    (ok,) = broadcast_object_list([ok])
    return 0 if ok else 1


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
    sys.exit(main())
