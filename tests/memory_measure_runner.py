"""Measures each case sharded with FSDP2 (memory_fixtures.measure) and writes the bytes this
rank holds to OUT/rank-<k>.json, a list in the order of CASES; a case whose set-up or step
fails is {"error": what it raised}.

    torchrun --standalone --nproc_per_node 2 memory_measure_runner.py OUT CASES_JSON"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from accelerate import Accelerator

from simpletuner.common.clean_exit import exit_process
from simpletuner.models.builtin import resolve_model_path

from memory_fixtures import measure


def measured_or_error(case: dict) -> dict:
    try:
        return measure(case, sharded=True)
    except Exception as error:  # every rank fails the same way, before the next collective
        return {"error": f"{type(error).__name__}: {error}"[:300]}


def main() -> None:
    out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
    for case in cases:  # built before the process group exists (transformers then saves once)
        resolve_model_path(f"builtin:tiny-{case['family']}")
    accelerator = Accelerator(cpu=True)
    results = [measured_or_error(case) for case in cases]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{accelerator.process_index}.json").write_text(json.dumps(results))
    accelerator.end_training()
    exit_process(0)  # as the trainer exits: see exit_process


if __name__ == "__main__":
    main()
