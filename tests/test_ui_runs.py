"""Runs made through the web UI are ordinary tiny trainings through ./train.sh: with one slot
they run one after the other; a server killed with SIGKILL leaves its run training, and the
restarted server lists it as running, then finished, and starts the queued run; stop ends a
run preempted with 75; a run that cannot start shows failed with the end of its console."""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest
from pathlib import Path

from simpletuner.ui.queue_db import ACTIVE
from training_fixtures import make_shapes
from ui_fixtures import TINY_CONFIG, Server, dataset

RUN_TIMEOUT_S = 300
LONG_RUN_STEPS = 500


def group_alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


class UiRunsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ui-runs-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.workspace = Path(cls.tmp) / "workspace"
        make_shapes(cls.workspace / "data", per_size=2, sizes=((64, 64),))
        make_shapes(cls.workspace / "doomed", per_size=2, sizes=((64, 64),))

    def queue_run(self, server: Server, name: str, folder: str = "data", **config) -> str:
        answer = server.post("/api/runs", {"name": name, "config": {**TINY_CONFIG, **config},
                                           "datasets": [dataset(folder)]})
        self.assertEqual(answer.status, 201, answer.text)
        return answer.json()["id"]

    def test_the_queue_survives_the_server_and_runs_in_order(self):
        first_server = Server(self.workspace, self.tmp)
        self.addCleanup(first_server.close)  # and the runs it started, if still going
        first = self.queue_run(first_server, "first", trace_samples=True)
        # Long enough that the stop arrives before its end on any machine.
        second = self.queue_run(first_server, "second", max_train_steps=LONG_RUN_STEPS,
                                checkpointing_steps=0)
        doomed = self.queue_run(first_server, "doomed", folder="doomed")
        running = first_server.wait_for_run(first, lambda run: run["status"] == "running", 30,
                                            "running")
        self.assertEqual(first_server.run(second)["status"], "queued")
        first_server.kill()
        self.assertTrue(group_alive(running["pid"]), "the run died with the server")
        shutil.rmtree(self.workspace / "doomed")  # so the third run fails at train.sh's check

        with Server(self.workspace, self.tmp) as server:
            self.assertEqual(server.run(first)["status"], "running")
            self.assertEqual(server.run(second)["status"], "queued")
            ended = server.wait_for_run(first, lambda run: run["status"] != "running",
                                        RUN_TIMEOUT_S, "ended")
            self.assertEqual((ended["status"], ended["exit_status"], ended["step"]),
                             ("finished", 0, 3), ended["message"])
            self.assertGreater(ended["ended_at"], running["started_at"])
            page = server.request("GET", f"/runs/{first}").text  # its trace, checked once ended
            self.assertIn('<p class="ok" id="exactly-once">', page)
            self.assertIn("0 missing, 0 duplicated", page)

            started = server.wait_for_run(second, lambda run: run["step"], RUN_TIMEOUT_S,
                                          "training")
            self.assertGreaterEqual(started["started_at"], ended["ended_at"])
            self.assertEqual(server.run(doomed)["status"], "queued")
            self.assertEqual(server.post(f"/api/runs/{second}/stop").status, 202)
            stopped = server.wait_for_run(second, lambda run: run["status"] != "running",
                                          RUN_TIMEOUT_S, "stopped")
            self.assertEqual((stopped["status"], stopped["exit_status"]), ("preempted", 75),
                             stopped["message"])
            self.assertLess(stopped["step"], LONG_RUN_STEPS)
            self.assertIn("preempted by SIGTERM", stopped["message"])
            output = self.workspace / "runs" / second / "output"
            self.assertTrue(list(output.glob("checkpoint-*")), "no checkpoint at the stop")

            failed = server.wait_for_run(doomed, lambda run: run["status"] not in ACTIVE,
                                         RUN_TIMEOUT_S, "ended")
            self.assertEqual((failed["status"], failed["exit_status"]), ("failed", 2))
            self.assertIn("doomed", failed["message"])  # the console's end names the folder


if __name__ == "__main__":
    unittest.main()
