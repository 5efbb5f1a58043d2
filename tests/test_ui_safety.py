"""The web UI's safety and its API without training: a real server (--slots 0, so runs stay
queued), requests without the secret, from another origin, for another Host, for paths
outside the workspace; text from names and captions escaped in pages; the queue's order and
cancel; the event stream; the refusal of a non-loopback bind without a token."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import unittest
from pathlib import Path

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from launching import run_bounded
from training_fixtures import environment, make_shapes
from ui_fixtures import TINY_CONFIG, Server, dataset

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


class UiSafetyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ui-safety-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.workspace = Path(cls.tmp) / "workspace"
        make_shapes(cls.workspace / "data", per_size=2, sizes=((64, 64),))
        (cls.workspace / "data" / "64x64-00.txt").write_text(f"a caption {SCRIPT}")
        (cls.workspace / "outside").symlink_to("/etc")
        cls.server = Server(cls.workspace, cls.tmp, "--slots", "0")
        cls.addClassCleanup(cls.server.close)

    def new_run(self, name: str, **config) -> str:
        answer = self.server.post("/api/runs", {"name": name, "config": {**TINY_CONFIG, **config},
                                                "datasets": [dataset("data")]})
        self.assertEqual(answer.status, 201, answer.text)
        return answer.json()["id"]

    def test_the_secret_is_private_to_its_owner(self):
        mode = stat.S_IMODE(os.stat(self.workspace / ".token").st_mode)
        self.assertEqual(mode, 0o600)

    def test_a_state_change_without_the_secret_is_refused(self):
        body = {"name": "x", "config": TINY_CONFIG, "datasets": [dataset("data")]}
        self.assertEqual(self.server.request("POST", "/api/runs", body).status, 403)
        wrong = self.server.request("POST", "/api/runs", body,
                                    {"Authorization": "Bearer not-the-secret"})
        self.assertEqual(wrong.status, 403)
        names = [run["name"] for run in self.server.request("GET", "/api/runs").json()["runs"]]
        self.assertNotIn("x", names)

    def test_another_origin_is_refused_and_ours_is_not(self):
        body = {"config": TINY_CONFIG, "datasets": [dataset("data")]}
        foreign = self.server.post("/api/check", body, {"Origin": "http://evil.example"})
        self.assertEqual(foreign.status, 403, foreign.text)
        own = self.server.post("/api/check", body, {"Origin": self.server.origin})
        self.assertEqual(own.status, 200, own.text)
        self.assertEqual(own.json(), {"problems": []})

    def test_another_host_is_refused_and_loopback_aliases_are_not(self):
        rebound = self.server.request("GET", "/api/runs", headers={"Host": "evil.example:80"})
        self.assertEqual(rebound.status, 400)
        wrong_port = self.server.request("GET", "/", headers={"Host": "127.0.0.1:1"})
        self.assertEqual(wrong_port.status, 400)
        alias = self.server.request("GET", "/api/runs",
                                    headers={"Host": f"localhost:{self.server.port}"})
        self.assertEqual(alias.status, 200)

    def test_paths_outside_the_roots_are_refused(self):
        for path in ("../../etc/passwd", "/etc", "outside", "outside/passwd"):
            answer = self.server.post("/api/runs", {"name": "escape", "config": TINY_CONFIG,
                                                    "datasets": [dataset(path)]})
            self.assertEqual(answer.status, 422, path)
            self.assertIn("outside the workspace", answer.json()["problems"][0]["message"])
            self.assertEqual(self.server.request("GET", f"/api/files?path={path}").status, 403)
            self.assertEqual(self.server.request("GET", f"/files?path={path}").status, 403)
        self.assertEqual(self.server.request("GET", "/api/files?path=data").status, 200)

    def test_a_config_problem_comes_back_as_records(self):
        answer = self.server.post("/api/runs", {"name": "bad", "config": {
            **TINY_CONFIG, "learning_rate": "fast"}, "datasets": [dataset("data")]})
        self.assertEqual(answer.status, 422)
        problems = answer.json()["problems"]
        self.assertEqual([(p["file"], p["path"]) for p in problems],
                         [("config.json", "learning_rate")], problems)
        checked = self.server.post("/api/check", {"config": TINY_CONFIG,
                                                  "datasets": [dataset("no-such-folder")]})
        self.assertTrue(any("no-such-folder" in problem["message"]
                            for problem in checked.json()["problems"]), checked.text)

    def test_plan_shows_the_buckets_and_the_steps_per_epoch(self):
        answer = self.server.post("/api/plan", {"config": TINY_CONFIG, "processes": 2,
                                                "datasets": [dataset("data")]})
        self.assertEqual(answer.status, 200, answer.text)
        plan = answer.json()["plan"]
        self.assertEqual(plan["datasets"], {"shapes": {"buckets": {"64x64": 2}, "skipped": 0}})
        self.assertEqual(plan["num_processes"], 2)
        self.assertIn("smaller than the effective batch size E = 4", plan["problem"])
        alone = self.server.post("/api/plan", {"config": TINY_CONFIG,
                                               "datasets": [dataset("data")]}).json()["plan"]
        self.assertEqual(alone["optimizer_steps_per_epoch"][0], 1)
        self.assertIsNone(alone["problem"])
        self.assertNotIn("memory", alone)  # only when asked: it costs seconds
        memory = self.server.post("/api/plan", {"config": TINY_CONFIG, "gpu_memory": 0.5,
                                                "datasets": [dataset("data")]}).json()
        self.assertIn("peak per rank", memory["plan"]["memory"]["text"])
        self.assertIsNone(memory["plan"]["memory"]["verdict"])  # not estimated for sd1x
        refused = self.server.post("/api/plan", {"config": TINY_CONFIG,
                                                 "datasets": [dataset("outside")]}).json()
        self.assertEqual([p["path"] for p in refused["problems"]],
                         ["datasets[0].instance_data_dir"])

    def test_captions_thumbnails_and_roots_stay_inside_the_roots(self):
        folder = self.workspace / "captioned"  # its own: this test adds an image
        make_shapes(folder, per_size=2, sizes=((64, 64),))
        (folder / "64x64-00.txt").write_text(SCRIPT)
        image = folder / "64x64-01.png"
        page = self.server.request("GET", "/datasets?path=captioned").text
        self.assertIn(ESCAPED, page)
        self.assertNotIn(SCRIPT, page)
        thumb = self.server.request("GET", f"/api/thumbnail?path={image}")
        self.assertEqual((thumb.status, thumb.body[:4]), (200, b"\x89PNG"))
        made = lambda: sorted((self.workspace / "thumbnails").rglob("*.png"))
        first = made()
        self.server.request("GET", f"/api/thumbnail?path={image}")
        self.assertEqual(made(), first)  # made once
        os.utime(image, ns=(0, 0))  # an edited image gets a new one
        self.server.request("GET", f"/api/thumbnail?path={image}")
        self.assertEqual(len(made()), len(first) + 1)
        self.assertEqual(self.server.request("GET", "/api/thumbnail?path=/etc/hostname").status,
                         403)
        saved = self.server.post("/api/caption", {"path": str(image), "caption": "new"})
        self.assertEqual(saved.status, 200, saved.text)
        self.assertEqual(image.with_suffix(".txt").read_text(), "new")
        for outside in ("/etc/hostname", "outside/hostname", "data/../../x.png"):
            answer = self.server.post("/api/caption", {"path": outside, "caption": "x"})
            self.assertEqual(answer.status, 403, outside)
        linked = folder / "linked.png"
        linked.write_bytes(image.read_bytes())
        (folder / "linked.txt").symlink_to(Path(self.tmp) / "elsewhere.txt")
        self.assertEqual(self.server.post("/api/caption", {"path": str(linked),
                                                           "caption": "x"}).status, 403)
        self.assertFalse((Path(self.tmp) / "elsewhere.txt").exists())
        self.assertEqual(self.server.post("/api/workspace", {"dataset_roots": ["/"]}).status, 422)
        self.assertEqual(self.server.post("/api/workspace", {"dataset_roots": [self.tmp]}).status,
                         200)
        self.assertEqual(self.server.request("GET", f"/datasets?path={self.tmp}").status, 200)

    def test_delete_refuses_an_active_run_and_removes_an_ended_one(self):
        run_id = self.new_run("to delete")
        folder = self.workspace / "runs" / run_id
        self.assertEqual(self.server.post(f"/api/runs/{run_id}/delete").status, 409)
        self.assertTrue(folder.is_dir())
        self.assertEqual(self.server.post(f"/api/runs/{run_id}/cancel").status, 200)
        self.assertEqual(self.server.post(f"/api/runs/{run_id}/delete").status, 200)
        self.assertFalse(folder.exists())
        self.assertEqual(self.server.request("GET", f"/api/runs/{run_id}").status, 404)

    def test_a_run_serves_its_own_images_only(self):
        run_id = self.new_run("images")
        image = (self.workspace / "runs" / run_id / "output" / "validation" / "step-1"
                 / "image-00.png")
        image.parent.mkdir(parents=True)
        prompt = PngInfo()
        prompt.add_text("prompt", SCRIPT)  # as validation writes it
        Image.new("RGB", (8, 8)).save(image, pnginfo=prompt)
        url = f"/api/runs/{run_id}/file?path=validation%2Fstep-1%2Fimage-00.png"
        served = self.server.request("GET", url)
        self.assertEqual((served.status, served.body), (200, image.read_bytes()))
        page = self.server.request("GET", f"/runs/{run_id}").text
        self.assertIn(f'<img src="{url}"', page)  # the validation grid
        self.assertIn(f"step 1: {ESCAPED}", page)
        for path in ("../config.json", "../../../.token", "/etc/hostname",
                     "../../../data/64x64-00.png"):
            answer = self.server.request("GET", f"/api/runs/{run_id}/file?path={path}")
            self.assertEqual(answer.status, 403, path)

    def test_compare_draws_each_runs_losses_and_duplicate_copies_a_config(self):
        first, second = self.new_run(SCRIPT, learning_rate=0.25), self.new_run("other")
        for run_id, count in ((first, 3), (second, 2)):
            output = self.workspace / "runs" / run_id / "output"
            output.mkdir(parents=True, exist_ok=True)
            (output / "events.jsonl").write_text("".join(
                json.dumps({"type": "step", "step": step, "loss": 1 / step}) + "\n"
                for step in range(1, count + 1)) + '{"type": "end", "step": 3}\n')
        page = self.server.request("GET", f"/compare?ids={first},{second}").text
        curves = [line.split('"')[0].split() for line in page.split('points="')[1:]]
        self.assertEqual([len(curve) for curve in curves], [3, 2])
        self.assertIn(ESCAPED, page)
        self.assertNotIn(SCRIPT, page)
        self.assertEqual(self.server.request("GET", "/compare?ids=../x").status, 404)
        copy = self.server.request("GET", f"/new?from={first}").text
        self.assertIn('name="learning_rate" data-kind=number value="0.25"', copy)
        self.assertIn(f"{ESCAPED} (copy)", copy)
        for set_by_the_server in ("output_dir", "data_backend_config"):
            self.assertNotIn(f"&quot;{set_by_the_server}&quot;", copy)  # not in "other keys"

    def test_names_and_captions_are_escaped_in_pages(self):
        run_id = self.new_run(SCRIPT)
        for page in ("/", f"/runs/{run_id}"):
            html = self.server.request("GET", page).text
            self.assertIn(ESCAPED, html)
            self.assertNotIn(SCRIPT, html)
        files = self.server.request("GET", "/files?path=data").text
        self.assertIn(f"a caption {ESCAPED}", files)
        self.assertNotIn(SCRIPT, files)

    def test_pages_load_only_the_servers_own_files(self):
        answer = self.server.request("GET", "/new")
        self.assertIn("default-src 'self'", answer.headers["content-security-policy"])
        self.assertNotIn("http", answer.text.replace(self.server.origin, ""))
        self.assertEqual(self.server.request("GET", "/static/ui.js").status, 200)

    def test_the_queue_is_reordered_and_cancelled(self):
        first, second = self.new_run("first"), self.new_run("second")
        moved = self.server.post(f"/api/runs/{second}/move", {"index": 0})
        self.assertEqual(moved.status, 200, moved.text)
        queued = [run["id"] for run in self.server.request("GET", "/api/runs").json()["runs"]
                  if run["status"] == "queued"]
        self.assertLess(queued.index(second), queued.index(first))
        self.assertEqual(self.server.post(f"/api/runs/{first}/cancel").status, 200)
        self.assertEqual(self.server.run(first)["status"], "cancelled")
        self.assertEqual(self.server.post(f"/api/runs/{first}/cancel").status, 409)
        self.assertEqual(self.server.post(f"/api/runs/{first}/stop").status, 409)
        for asked in ("checkpoint", "validate"):  # a queued run has no trainer to ask
            self.assertEqual(self.server.post(f"/api/runs/{second}/{asked}").status, 409)

    def test_resume_queues_an_ended_run_again_from_latest(self):
        run_id, later = self.new_run("resumed"), self.new_run("later")
        self.assertEqual(self.server.post(f"/api/runs/{run_id}/resume").status, 409)  # queued
        self.server.post(f"/api/runs/{run_id}/cancel")
        self.assertEqual(self.server.post(f"/api/runs/{run_id}/resume").status, 202)
        run = self.server.run(run_id)
        self.assertEqual(run["status"], "queued")
        self.assertGreater(run["queue_index"], self.server.run(later)["queue_index"])
        config = json.loads((self.workspace / "runs" / run_id / "config.json").read_text())
        self.assertEqual(config["resume_from_checkpoint"], "latest")
        self.assertEqual(config["output_dir"], str(self.workspace / "runs" / run_id / "output"))

    def test_a_body_that_is_not_json_is_refused(self):
        answer = self.server.post("/api/runs", b"{not json")
        self.assertEqual(answer.status, 422)
        self.assertIn("not JSON", answer.json()["problems"][0]["message"])

    def test_events_stream_from_the_line_after_last_event_id(self):
        run_id = self.new_run("events")
        self.server.post(f"/api/runs/{run_id}/cancel")
        output = self.workspace / "runs" / run_id / "output"
        output.mkdir()
        lines = ['{"type": "start", "step": 0, "time": 1.0}',
                 '{"type": "step", "step": 1, "time": 2.0, "loss": 0.5}',
                 '{"type": "end", "step": 1, "time": 3.0}']
        (output / "events.jsonl").write_text("\n".join(lines) + "\n")
        answer = self.server.request("GET", f"/api/runs/{run_id}/events",
                                     headers={"Last-Event-ID": "1"})
        self.assertEqual(answer.headers["content-type"].split(";")[0], "text/event-stream")
        self.assertEqual(answer.text, f"id: 2\ndata: {lines[1]}\n\nid: 3\ndata: {lines[2]}\n\n"
                         "event: close\ndata: cancelled\n\n")
        self.assertEqual(self.server.run(run_id)["step"], 1)

    def test_a_token_guards_every_request(self):
        token = "a-token-of-sixteen-or-more"
        workspace = Path(self.tmp) / "token-workspace"
        with Server(workspace, self.tmp, "--slots", "0", "--token", token) as server:
            self.assertEqual(server.request("GET", "/api/runs").status, 401)
            self.assertEqual(server.request("GET", "/").status, 303)
            allowed = server.request("GET", "/api/runs",
                                     headers={"Authorization": f"Bearer {token}"})
            self.assertEqual(allowed.status, 200)
            login = server.request("POST", "/login", f"token={token}".encode(),
                                   {"Content-Type": "application/x-www-form-urlencoded"})
            self.assertEqual(login.status, 303)
            cookie = login.headers["set-cookie"].split(";")[0]
            self.assertEqual(server.request("GET", "/", headers={"Cookie": cookie}).status, 200)
            bad = server.request("POST", "/login", b"token=wrong",
                                 {"Content-Type": "application/x-www-form-urlencoded"})
            self.assertEqual(bad.status, 401)

    def test_a_second_server_on_the_workspace_does_not_start(self):
        result = run_bounded([sys.executable, "-m", "simpletuner", "serve", "--port", "0",
                              "--workspace", str(self.workspace)],
                             tmpdir=self.tmp, env=environment(self.tmp), timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("served by another server", result.stderr)

    def test_a_non_loopback_bind_without_a_token_does_not_start(self):
        result = run_bounded([sys.executable, "-m", "simpletuner", "serve", "--host", "0.0.0.0",
                              "--workspace", str(Path(self.tmp) / "never")],
                             tmpdir=self.tmp, env=environment(self.tmp), timeout=60)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("without an access token", result.stderr)
        self.assertFalse((Path(self.tmp) / "never").exists())


if __name__ == "__main__":
    unittest.main()
