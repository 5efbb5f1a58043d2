"""`python -m simpletuner slurm-script`: the generic script is examples/slurm/train.sbatch as
kept in the repository, and a config's script carries that config's nodes x processes, its path
and GPUs per node; a split that does not divide and a broken config are refused with the reason;
README's "On a cluster" explains lines the example has.
(The script itself runs on a real SLURM in test_slurm.py.)"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
import unittest
from pathlib import Path

from launching import REPO, run_bounded
from simpletuner.cli import main
from training_fixtures import write_config


def slurm_script(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["slurm-script", *args])
    return status, out.getvalue(), err.getvalue()


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


class SlurmScriptTest(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="st-slurm-script-"))
        (self.tmp / "data").mkdir()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def test_the_example_is_the_generic_script_and_parses(self):
        status, script, _ = slurm_script()
        self.assertEqual(status, 0)
        example = REPO / "examples" / "slurm" / "train.sbatch"
        self.assertEqual(example.read_text(), script,
                         "regenerate: python -m simpletuner slurm-script > "
                         "examples/slurm/train.sbatch")
        self.assertTrue(example.stat().st_mode & 0o100, "the example is executable")
        checked = run_bounded(["bash", "-n", example], tmpdir=self.tmp, timeout=30)
        self.assertEqual(checked.returncode, 0, checked.stderr)
        for line in ("#SBATCH --requeue", "#SBATCH --signal=B:TERM@120",
                     "#SBATCH --open-mode=append"):
            self.assertIn(line, sbatch_lines(script))

    def test_the_readme_explains_the_example_s_own_lines(self):
        readme = (REPO / "README.md").read_text()
        section = readme[readme.index("## On a cluster"):]
        section = section[:section.index("\n## ")]
        explained = re.findall(r"`(#SBATCH [^`]+)`", section)
        self.assertGreaterEqual(len(explained), 5)
        example = sbatch_lines((REPO / "examples" / "slurm" / "train.sbatch").read_text())
        self.assertEqual([line for line in explained if line not in example], [])

    def test_a_config_gets_its_nodes_processes_and_gpus(self):
        config = write_config(self.tmp, self.tmp / "data", "run", num_processes=4)
        status, script, err = slurm_script(str(config), "--nodes", "2")
        self.assertEqual(status, 0, err)
        lines = sbatch_lines(script)
        for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                     "#SBATCH --gpus-per-node=2", f"#SBATCH --chdir={REPO}",
                     "#SBATCH --job-name=run-out"):
            self.assertIn(line, lines)
        self.assertIn(f"\nconfig={config}\n", script)
        (self.tmp / "run.sbatch").write_text(script)
        checked = run_bounded(["bash", "-n", self.tmp / "run.sbatch"], tmpdir=self.tmp,
                              timeout=30)
        self.assertEqual(checked.returncode, 0, checked.stderr)
        _, cpu_script, _ = slurm_script(str(config), "--nodes", "4", "--cpu")
        self.assertIn("#SBATCH --ntasks-per-node=1", sbatch_lines(cpu_script))
        self.assertFalse([line for line in sbatch_lines(cpu_script) if "gpus" in line])

    def test_processes_that_do_not_divide_over_the_nodes_are_refused(self):
        config = write_config(self.tmp, self.tmp / "data", "run", num_processes=4)
        status, script, err = slurm_script(str(config), "--nodes", "3")
        self.assertEqual((status, script), (2, ""))
        self.assertIn("num_processes 4 does not divide over 3 nodes", err)

    def test_a_config_mistake_is_reported_not_scripted(self):
        config = write_config(self.tmp, self.tmp / "data", "run", train_bach_size=2)
        status, script, err = slurm_script(str(config))
        self.assertEqual((status, script), (2, ""))
        self.assertIn("unknown key 'train_bach_size'", err)


if __name__ == "__main__":
    unittest.main()
