"""The web UI's parts without a server: a request's paths confined and made absolute, the
queue's order and state changes, and the event stream's tail of a file that grows and is cut
back."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import unittest
from pathlib import Path

from simpletuner.ui.checking import problems_of
from simpletuner.ui.events import LineTail, RunEvents
from simpletuner.ui.option_form import COMMON, form_options, options_html
from simpletuner.ui.queue_db import RunQueue
from simpletuner.ui.run_request import BadRequest, read_request
from simpletuner.ui.scheduler import Scheduler
from simpletuner.ui.settings import ServerSettings, device_sets
from simpletuner.ui.workspace import Workspace


class TempFolder(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="ui-parts-"))
        self.addCleanup(shutil.rmtree, self.root, ignore_errors=True)


class RunRequestTest(TempFolder):
    def setUp(self):
        super().setUp()
        self.workspace = Workspace(self.root / "workspace")
        self.workspace.prepare()
        (self.workspace.root / "data").mkdir()
        (self.workspace.root / "out").symlink_to(self.root)

    def read(self, config: dict | None = None, *datasets: dict):
        return read_request({"name": "n", "config": config or {}, "datasets": list(datasets)},
                            self.workspace, named=True)

    def test_paths_inside_are_made_absolute_and_names_that_are_not_paths_kept(self):
        request = self.read({"pretrained_model_name_or_path": "org/model",
                             "resume_from_checkpoint": "checkpoint-12",
                             "user_prompt_library": "data/prompts.json"},
                            {"id": "a", "instance_data_dir": "data"})
        self.assertEqual(request.datasets[0]["instance_data_dir"],
                         str(self.workspace.root / "data"))
        self.assertEqual(request.config["user_prompt_library"],
                         str(self.workspace.root / "data" / "prompts.json"))
        self.assertEqual(request.config["pretrained_model_name_or_path"], "org/model")
        self.assertEqual(request.config["resume_from_checkpoint"], "checkpoint-12")

    def test_paths_outside_are_refused_by_key(self):
        with self.assertRaises(BadRequest) as refused:
            self.read({"pretrained_model_name_or_path": "./../model",
                       "resume_from_checkpoint": "../elsewhere/checkpoint-3"},
                      {"id": "a", "instance_data_dir": "out/data"},
                      {"id": "b", "instance_data_dir": "data", "parquet": {"path": "/etc/t.jsonl"}})
        keys = sorted((problem["file"], problem["key"]) for problem in refused.exception.problems)
        self.assertEqual(keys, [("config.json", "pretrained_model_name_or_path"),
                                ("config.json", "resume_from_checkpoint"),
                                ("multidatabackend.json[0]", "instance_data_dir"),
                                ("multidatabackend.json[1].parquet", "path")])

    def test_a_dataset_root_admits_its_folder(self):
        self.workspace.settings_path.write_text(f'{{"dataset_roots": ["{self.root}"]}}')
        request = self.read(None, {"id": "a", "instance_data_dir": "out"})
        self.assertEqual(request.datasets[0]["instance_data_dir"], str(self.root))

    def test_a_body_of_the_wrong_shape_names_each_part(self):
        with self.assertRaises(BadRequest) as refused:
            read_request({"name": "", "config": [], "datasets": {}}, self.workspace, named=True)
        self.assertEqual([problem["key"] for problem in refused.exception.problems],
                         ["name", "config", "datasets"])


class RunQueueTest(TempFolder):
    def test_order_moves_cancels_and_requeues(self):
        queue = RunQueue(self.root / "queue.sqlite")
        for run_id in ("a", "b", "c"):
            queue.add(run_id, run_id)
        self.assertTrue(queue.move("c", 0))
        self.assertEqual([run.id for run in queue.in_state("queued")], ["c", "a", "b"])
        self.assertTrue(queue.claim("c"))
        self.assertFalse(queue.cancel("c"))  # starting: stop it instead
        self.assertFalse(queue.move("c", 2))
        self.assertTrue(queue.cancel("a"))
        self.assertFalse(queue.claim("a"))  # a cancelled run never starts
        self.assertTrue(queue.requeue("a"))
        self.assertEqual([run.id for run in queue.in_state("queued")], ["b", "a"])
        self.assertFalse(queue.requeue("b"))  # already queued


# A stand-in for the repository's train.sh: records the GPU set its run was given, then ends.
RECORDING_TRAIN_SH = """#!/usr/bin/env bash
echo "${CUDA_VISIBLE_DEVICES-unset}" > "$(dirname "$1")/devices.txt"
sleep 0.5
"""
RUNS = ("a00000000001", "a00000000002", "a00000000003")  # run ids as the workspace makes them


class DeviceSetsTest(TempFolder):
    """--devices: a slot per GPU set, each run launched with its set alone, a set taken again
    only once its run has ended."""

    def scheduler(self, devices: tuple[str, ...]) -> tuple[Scheduler, RunQueue, Workspace]:
        repo = self.root / "repo"
        repo.mkdir()
        (repo / "train.sh").write_text(RECORDING_TRAIN_SH)
        (repo / "train.sh").chmod(0o755)
        workspace = Workspace(self.root / "workspace")
        workspace.prepare()
        queue = RunQueue(workspace.queue_path)
        for run_id in RUNS:
            workspace.run_folder(run_id).mkdir(parents=True)
            queue.add(run_id, run_id)
        return Scheduler(workspace, queue, len(devices), repo, devices), queue, workspace

    def until_ended(self, scheduler: Scheduler, queue: RunQueue, count: int) -> None:
        deadline = time.monotonic() + 30
        while len(queue.in_state("finished", "failed")) < count:
            self.assertLess(time.monotonic(), deadline, queue.all())
            time.sleep(0.1)
            scheduler.tick()

    def test_each_run_trains_on_a_free_set_of_its_own(self):
        scheduler, queue, workspace = self.scheduler(("0,1", "2,3"))
        scheduler.tick()
        first, second, third = RUNS
        running = {run.id: run.devices for run in queue.in_state("running")}
        self.assertEqual(running, {first: "0,1", second: "2,3"})  # both sets are taken
        self.assertEqual([run.id for run in queue.in_state("queued")], [third])
        self.until_ended(scheduler, queue, 3)
        seen = [(workspace.run_folder(run_id) / "devices.txt").read_text().strip()
                for run_id in RUNS]
        self.assertEqual(seen[:2], ["0,1", "2,3"])
        self.assertIn(seen[2], ("0,1", "2,3"))

    def test_without_sets_runs_see_the_servers_own_devices(self):
        scheduler, queue, workspace = self.scheduler(())
        scheduler.slots = 3
        scheduler.tick()
        self.until_ended(scheduler, queue, 3)
        self.assertEqual((workspace.run_folder(RUNS[0]) / "devices.txt").read_text().strip(),
                         "unset")

    def test_the_argument_takes_disjoint_sets_of_indices(self):
        self.assertEqual(device_sets("0,1|2, 3"), ("0,1", "2,3"))
        for wrong in ("0,1|1,2", "0|a", "0||1"):
            with self.subTest(wrong=wrong), self.assertRaises(argparse.ArgumentTypeError):
                device_sets(wrong)


class HostNamesTest(unittest.TestCase):
    def settings(self, host: str) -> ServerSettings:
        return ServerSettings(host, 8765, Path("/w"), 1, "a-token-of-sixteen-or-more", Path("/r"))

    def test_the_bound_name_and_its_loopback_aliases_only(self):
        loopback = self.settings("127.0.0.2")
        for host in ("127.0.0.2:8765", "localhost:8765", "127.0.0.1:8765", "[::1]:8765"):
            self.assertTrue(loopback.answers_host(host), host)
        for host in ("127.0.0.2:8766", "127.0.0.2", "rebound.example:8765", ""):
            self.assertFalse(loopback.answers_host(host), host)
        self.assertTrue(self.settings("::1").answers_host("[::1]:8765"))
        lan = self.settings("10.0.0.5")
        self.assertTrue(lan.answers_host("10.0.0.5:8765"))
        self.assertFalse(lan.answers_host("localhost:8765"))
        self.assertTrue(self.settings("0.0.0.0").answers_host("any.name:1"))


class LineTailTest(TempFolder):
    def test_complete_lines_numbered_after_a_cut_back(self):
        log = self.root / "events.jsonl"
        log.write_text("one\ntwo\nthr")
        tail = LineTail(log, after_line=1)
        self.assertEqual(tail.read(), [(2, "two")])  # the torn line waits for its end
        with open(log, "a") as out:
            out.write("ee\nfour\n")
        self.assertEqual(tail.read(), [(3, "three"), (4, "four")])
        log.write_text("one\ntwo\n")  # cut back to line 2, then appended
        self.assertEqual(tail.read(), [])
        with open(log, "a") as out:
            out.write("three again\n")
        self.assertEqual(tail.read(), [(3, "three again")])


class RunEventsTest(TempFolder):
    def test_a_step_log_streams_as_step_events_until_events_jsonl_exists(self):
        (self.root / "training_steps.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
        events = RunEvents(self.root, after_line=0)
        self.assertEqual([(n, json.loads(line)) for n, line in events.read()],
                         [(1, {"type": "step", "step": 1, "loss": 0.5})])
        (self.root / "events.jsonl").write_text('{"type": "start", "step": 0}\n')
        self.assertEqual(events.read(), [(1, '{"type": "start", "step": 0}')])


class ProblemRecordTest(TempFolder):
    def test_each_problem_names_the_json_path_of_its_value(self):
        config = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                  "learning_rate": "fast", "train_batch_size": 1}
        datasets = [{"id": "a", "instance_data_dir": str(self.root), "repeats": -1},
                    {"id": "b", "instance_data_dir": str(self.root / "none")}]
        records = problems_of(config, datasets, self.root / "check")
        self.assertEqual({record["path"] for record in records},
                         {"learning_rate", "datasets[0].repeats", "datasets[1].instance_data_dir"},
                         records)
        rate = next(record for record in records if record["path"] == "learning_rate")
        self.assertEqual((rate["file"], rate["key"]), ("config.json", "learning_rate"))
        self.assertNotIn(str(self.root), rate["message"])  # the check folder is no news
        missing = problems_of({"model_family": "sd1x"}, [], self.root / "check")
        self.assertIn("pretrained_model_name_or_path", [record["path"] for record in missing])


class OptionFormTest(unittest.TestCase):
    def test_the_form_offers_every_option_by_its_type_common_ones_first(self):
        options = {option.name: option for option in form_options()}
        self.assertEqual([option.name for option in form_options()][:len(COMMON)],
                         list(COMMON))
        self.assertNotIn("output_dir", options)  # the server sets it
        self.assertEqual(options["lr_scheduler"].kind, "choice")
        self.assertIn("cosine", options["lr_scheduler"].choices)
        self.assertEqual((options["learning_rate"].kind, options["learning_rate"].default),
                         ("number", "1e-05"))
        self.assertEqual(options["use_ema"].kind, "bool")
        self.assertEqual(options["train_batch_size"].kind, "int")
        page = options_html({"lr_scheduler": "cosine", "validation_prompt": '"<b>"'})
        self.assertIn('<option value="cosine" selected>', page)
        self.assertIn("&quot;&lt;b&gt;&quot;", page)
        self.assertNotIn("<b>", page)


if __name__ == "__main__":
    unittest.main()
