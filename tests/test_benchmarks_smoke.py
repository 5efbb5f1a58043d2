"""Every script in benchmarks/ runs at its smallest (--smoke), exits 0 and prints its table: a
benchmark that rots (bench_split.py called SortedIds.append long after SortedIds became
read-only) fails here instead of on the day someone wants its figures. The figures of a smoke
run mean nothing; benchmarks/PERFORMANCE.md holds the real ones."""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path

from launching import REPO, run_bounded
from training_fixtures import environment

BENCHMARKS = REPO / "benchmarks"
# Each script, and a column of the table it prints.
TABLE_COLUMN = {
    "bench_activation_profiler.py": "ratio",
    "bench_block_swap_gpu.py": "measured_over_planned",
    "bench_bucket_tail.py": "carry / trim",
    "bench_dataset_schedule.py": "timeline at epoch 1000",
    "bench_discovery.py": "x cold",
    "bench_index_cache.py": "json / this",
    "bench_index_digest.py": "computed s (before)",
    "bench_memory.py": "x adamw/no_change",
    "bench_parquet.py": "x pyarrow",
    "bench_s3.py": "x baseline",
    "bench_s3_clients.py": "boto3 / this",
    "bench_sampler_state.py": "previous / this size",
    "bench_speed_options.py": "x eager",
    "bench_split.py": "x reference",
    "bench_train.py": "x bare",
    "bench_video_discovery.py": "x cold",
    "plan_24gb.py": "fits_without_swap",
}
LIBRARIES = {"benchlib.py", "device_idle.py"}  # imported by the scripts, not run


# One interpreter runs every script in turn, as `python <script> --smoke` would (importing
# torch and the trainer once, not once per script: that was most of the time). Each script's
# stdout and error go to a JSON file; its children (rclone, probe workers) may write to fd 1.
RUN_EACH = r"""
import contextlib, io, json, runpy, sys, traceback
folder, results_path, scripts = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, folder)
results = {}
for script in scripts:
    out, error = io.StringIO(), None
    sys.argv = [script, "--smoke"]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(f"{folder}/{script}", run_name="__main__")
    except SystemExit as exc:
        error = None if exc.code in (None, 0) else f"exit status {exc.code}"
    except BaseException:
        error = traceback.format_exc()
    results[script] = {"error": error, "stdout": out.getvalue()}
with open(results_path, "w") as handle:
    json.dump(results, handle)
"""


class BenchmarkSmokeTest(unittest.TestCase):
    def test_every_script_is_listed(self):
        scripts = {path.name for path in BENCHMARKS.glob("*.py")}
        self.assertEqual(scripts - LIBRARIES, set(TABLE_COLUMN))

    def test_each_runs_at_its_smallest_and_prints_its_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            results_path = Path(tmp) / "results.json"
            run = run_bounded([sys.executable, "-c", RUN_EACH, BENCHMARKS, results_path,
                               *TABLE_COLUMN], tmpdir=tmp, timeout=600, env=environment(tmp),
                              cwd=BENCHMARKS)
            self.assertEqual(run.returncode, 0, run.stderr[-3000:])
            results = json.loads(results_path.read_text())
        for script, column in TABLE_COLUMN.items():
            with self.subTest(script=script):
                self.assertIsNone(results[script]["error"], results[script]["error"])
                self.assertIn(column, results[script]["stdout"])


if __name__ == "__main__":
    unittest.main()
