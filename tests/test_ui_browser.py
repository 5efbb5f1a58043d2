"""The web UI in a real headless Chromium against a real server and real tiny runs: a new run
whose mistake is shown at its field, fixed and queued; its page's step count and loss curve
growing from the event stream without a reload; the runs page showing a second run queued,
then running once the first is stopped; the stop ending it preempted (75) and the resume
finishing it; a run page filling in as events land (eval curve, validation images,
checkpoints) and delete asking first; a caption edited on the datasets page being the one the
next run encodes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import unittest
from pathlib import Path

from headless_browser import Browser
from training_fixtures import make_shapes
from simpletuner.ui.queue_db import ACTIVE
from ui_fixtures import TINY_CONFIG, Server, dataset

RUN_TIMEOUT_S = 120
SCRIPT = "<script>document.title = 'ran'</script>"
EDITED = "a green circle, edited in the browser"
STEPS = 60
# Where the run page's screenshot is copied when set (docs/ui-run-page.png is one).
SCREENSHOT_TO = "SIMPLETUNER_UI_SCREENSHOT"


def text_embed_cache(output_dir: Path):
    """The run's text-embedding cache, as the trainer names its entries (by caption)."""
    from simpletuner.helpers.caching.prepare import text_components
    from simpletuner.helpers.caching.storage import model_identity
    from simpletuner.helpers.caching.text_embeds import TextEmbedCache
    from simpletuner.models.builtin import resolve_model_path

    model = resolve_model_path(TINY_CONFIG["pretrained_model_name_or_path"])
    identity = model_identity(model, text_components(model), TINY_CONFIG["model_family"])
    return TextEmbedCache(output_dir / "cache" / "text", identity)


def append_events(output_dir: Path, *events: dict) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    with open(output_dir / "events.jsonl", "a", encoding="utf-8") as log:
        log.write("".join(json.dumps({"time": 0, **event}) + "\n" for event in events))


def field(driver, name: str) -> str:
    return driver.find_element("css selector", f'[data-field="{name}"]').text


def points(driver, line: str = "#loss polyline.raw") -> int:
    return len(driver.find_element("css selector", line).get_attribute("points").split())


class UiBrowserTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ui-browser-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)

    def setUp(self):
        self.workspace = Path(self.tmp) / self._testMethodName  # its own runs and captions
        make_shapes(self.workspace / "data", per_size=2, sizes=((64, 64),))
        # A test of the page alone queues its run and never starts it.
        slots = "0" if self._testMethodName.startswith("test_page_") else "1"
        self.server = Server(self.workspace, self.tmp, "--slots", slots)
        self.addCleanup(self.server.close)
        self.browser = Browser(self.tmp)
        self.addCleanup(self.browser.close)
        self.driver = self.browser.driver

    def import_new_run(self, learning_rate: str) -> None:
        """The form filled by importing a SimpleTuner config.json (its "--" keys) and
        multidatabackend.json, pasted; then the run's name typed."""
        find = self.driver.find_element
        config = {**TINY_CONFIG, "max_train_steps": STEPS, "checkpointing_steps": 0,
                  "learning_rate": learning_rate, "tracker_run_name": "imported"}
        find("css selector", "#import summary").click()
        find("css selector", 'textarea[data-import="config"]').send_keys(
            json.dumps({f"--{key}": value for key, value in config.items()}))
        find("css selector", 'textarea[data-import="datasets"]').send_keys(
            json.dumps([dataset(self.workspace / "data")]))
        find("css selector", 'button[data-action="import"]').click()
        value = lambda name: find("css selector", f'#options [name="{name}"]').get_attribute(
            "value")
        self.assertEqual([value(name) for name in ("model_family", "max_train_steps",
                                                    "tracker_run_name", "resume_from_checkpoint")],
                         ["sd1x", str(STEPS), "imported", ""])  # the form's defaults replaced
        self.assertEqual(len(self.driver.find_elements("css selector", "#dataset-list .dataset")),
                         1)
        find("name", "run-name").send_keys("browser run")

    def queue_from_the_form(self) -> str:
        """A mistake shown at its field and nothing queued; fixed, planned and queued: the
        run's id, from the page the form goes to."""
        driver, browser = self.driver, self.browser
        driver.get(f"{self.server.origin}/new")
        self.import_new_run(learning_rate="fast")
        driver.find_element("css selector", "#new-run button:not([type])").click()
        at_field = browser.wait_for(lambda d: d.find_element(
            "css selector", '.option[data-path="learning_rate"] .problems').text,
            30, "the learning rate's problem at its field")
        self.assertIn("expected a number", at_field)
        self.assertEqual(driver.find_element("id", "problems").text, "")
        self.assertEqual(self.server.request("GET", "/api/runs").json()["runs"], [])

        rate = driver.find_element("css selector", '#options [name="learning_rate"]')
        rate.clear()
        rate.send_keys("0.001")
        driver.find_element("css selector", 'button[data-action="check"]').click()
        browser.wait_for(lambda d: d.find_element("id", "checked").text, 30, "checked")
        self.assertEqual(driver.find_element(
            "css selector", '.option[data-path="learning_rate"] .problems').text, "")
        driver.find_element("css selector", 'button[data-action="plan"]').click()
        plan = browser.wait_for(lambda d: d.find_element("id", "plan").text, 60, "the plan")
        self.assertIn("64x64 2", plan)  # its one bucket and its two images
        driver.find_element("css selector", "#new-run button:not([type])").click()
        browser.wait_for(lambda d: "/runs/" in d.current_url, 30, "on the run's page")
        return driver.current_url.rsplit("/", 1)[1]

    def test_a_run_made_in_the_browser_trains_stops_and_resumes(self):
        driver, browser = self.driver, self.browser
        run_id = self.queue_from_the_form()
        second_id = self.queue_second_run()
        self.assert_runs_page(second_id, "queued")

        driver.get(f"{self.server.origin}/runs/{run_id}")
        driver.execute_script("window.notReloaded = true;")
        step, curve = browser.wait_for(lambda d: points(d) >= 2 and (int(field(d, "step")),
                                                                     points(d)),
                                       RUN_TIMEOUT_S, "training")
        browser.wait_for(lambda d: int(field(d, "step")) > step and points(d) > curve,
                         RUN_TIMEOUT_S, "the step count and the loss curve advancing")
        self.assertGreater(points(driver, "#loss polyline.smooth"), 2)
        self.assertGreater(points(driver, "#lr polyline.raw"), 2)
        self.assertTrue(driver.execute_script("return window.notReloaded === true;"))
        driver.find_element("css selector", 'button[data-action="stop"]').click()
        browser.wait_for(lambda d: field(d, "status") == "preempted", RUN_TIMEOUT_S,
                         "preempted")
        self.assertEqual(field(driver, "exit_status"), "75")
        self.assertIn("preempted by SIGTERM", field(driver, "message"))
        self.assertLess(int(field(driver, "step")), STEPS)

        self.assert_runs_page(second_id, "running", "finished")  # it started after the stop
        driver.get(f"{self.server.origin}/runs/{run_id}")
        driver.find_element("css selector", 'button[data-action="resume"]').click()
        browser.wait_for(lambda d: field(d, "status") == "finished", 2 * RUN_TIMEOUT_S,
                         "finished")
        self.assertEqual(field(driver, "exit_status"), "0")
        browser.wait_for(lambda d: field(d, "step") == str(STEPS), 10, "at its last step")
        stop_checkpoint = driver.find_element("css selector", "#checkpoints li").text
        self.assertRegex(stop_checkpoint, r"^checkpoint-\d+ ")
        self.save_screenshot()

        driver.get(f"{self.server.origin}/compare?ids={run_id},{second_id}")
        curves = driver.find_elements("css selector", "#compare polyline")
        self.assertEqual(len(curves), 2)
        self.assertEqual(len(curves[0].get_attribute("points").split()), STEPS)
        self.assertEqual(driver.find_element("id", "legend").text.splitlines(),
                         ["browser run", "second"])

    def queue_second_run(self) -> str:
        answer = self.server.post("/api/runs", {"name": "second", "config": TINY_CONFIG,
                                                "datasets": [dataset(self.workspace / "data")]})
        self.assertEqual(answer.status, 201, answer.text)
        return answer.json()["id"]

    def assert_runs_page(self, run_id: str, *states: str) -> None:
        """The runs page shows the run in one of ``states`` (polled live, not reloaded)."""
        self.driver.get(self.server.origin + "/")
        cell = f'tr[data-run="{run_id}"] [data-field="status"]'
        self.browser.wait_for(lambda d: d.find_element("css selector", cell).text in states,
                              RUN_TIMEOUT_S, f"run {run_id} {' or '.join(states)}")

    def test_a_caption_edited_in_the_browser_is_what_the_next_run_trains_on(self):
        driver, browser = self.driver, self.browser
        image = self.workspace / "data" / "64x64-01.png"
        image.with_suffix(".txt").write_text(f"a caption {SCRIPT}")
        driver.get(f"{self.server.origin}/datasets?path=data&resolution=64&alignment=16")
        figure = driver.find_element("css selector", f'figure[data-image="{image}"]')
        self.assertEqual(figure.find_element("tag name", "textarea").get_attribute("value"),
                         f"a caption {SCRIPT}")  # shown as text, never run
        self.assertNotEqual(driver.title, "ran")
        self.assertEqual(driver.find_element("css selector", "#samples section h3").text,
                         "64x64: 2")
        self.assertTrue(driver.execute_script(  # the thumbnail loaded from the server
            "return arguments[0].naturalWidth > 0;", figure.find_element("tag name", "img")))
        caption = figure.find_element("tag name", "textarea")
        caption.clear()
        caption.send_keys(EDITED)
        figure.find_element("css selector", 'button[data-action="save-caption"]').click()
        browser.wait_for(lambda d: figure.find_element("class name", "saved").text == "saved",
                         10, "the caption saved")
        self.assertEqual(image.with_suffix(".txt").read_text(), EDITED)

        answer = self.server.post("/api/runs", {"name": "captions", "config": TINY_CONFIG,
                                                "datasets": [dataset(self.workspace / "data")]})
        run_id = answer.json()["id"]
        ended = self.server.wait_for_run(run_id, lambda run: run["status"] not in ACTIVE,
                                         RUN_TIMEOUT_S, "ended")
        self.assertEqual(ended["status"], "finished", ended["message"])
        cache = text_embed_cache(self.workspace / "runs" / run_id / "output")
        self.assertTrue(cache.path_for(EDITED).exists(), "the edited caption was not encoded")
        self.assertFalse(cache.path_for(f"a caption {SCRIPT}").exists())

    def test_page_fills_in_as_events_land_and_delete_asks_first(self):
        """A run's events written by hand (the run stays queued): the eval curve, the
        validation grid and the checkpoints grow as lines land; a cut-back redraws."""
        driver, browser = self.driver, self.browser
        run_id = self.queue_second_run()
        output = self.workspace / "runs" / run_id / "output"
        driver.get(f"{self.server.origin}/runs/{run_id}")
        self.assertEqual(driver.find_elements("css selector", "#validation img"), [])
        (output / "validation" / "step-2").mkdir(parents=True)
        shutil.copyfile(self.workspace / "data" / "64x64-00.png",
                        output / "validation" / "step-2" / "image-00.png")
        for step in (1, 2, 3):
            append_events(output, {"type": "step", "step": step, "loss": 1 / step, "lr": 0.1})
        append_events(output, {"type": "eval", "step": 2, "eval_loss": 0.5},
                      {"type": "eval", "step": 3, "eval_loss": 0.4},
                      {"type": "validation", "step": 2,
                       "files": ["validation/step-2/image-00.png", "../../../.token"]},
                      {"type": "checkpoint", "step": 3, "folder": "checkpoint-3"})
        browser.wait_for(lambda d: points(d, "#eval polyline.raw") == 2, 10, "the eval curve")
        image = browser.wait_for(lambda d: d.find_elements("css selector", "#validation img"),
                                 10, "the validation image")
        self.assertEqual(len(image), 1)  # the path out of output_dir is not an image shown
        self.assertTrue(driver.execute_script("return arguments[0].naturalWidth > 0;", image[0]))
        self.assertEqual(driver.find_element("id", "checkpoints").text, "checkpoint-3 (step 3)")
        append_events(output, {"type": "step", "step": 2, "loss": 0.9, "lr": 0.1})  # resumed
        browser.wait_for(lambda d: points(d) == 2, 10, "the curve cut back to step 2")

        driver.find_element("css selector", 'button[data-action="cancel"]').click()
        browser.wait_for(lambda d: field(d, "status") == "cancelled", 10, "cancelled")
        driver.find_element("css selector", 'button[data-action="delete"]').click()
        question = driver.switch_to.alert
        self.assertIn(f'Delete run "second" and its folder {self.workspace / "runs" / run_id}',
                      question.text)
        question.accept()
        browser.wait_for(lambda d: d.current_url == f"{self.server.origin}/", 10, "deleted")
        self.assertFalse(output.parent.exists())

    def save_screenshot(self) -> None:
        time.sleep(1)  # the last events drawn
        path = Path(self.tmp) / "run-page.png"
        self.assertTrue(self.driver.save_screenshot(str(path)))
        self.assertEqual(path.read_bytes()[:8], b"\x89PNG\r\n\x1a\n")
        if os.environ.get(SCREENSHOT_TO):
            shutil.copyfile(path, os.environ[SCREENSHOT_TO])


if __name__ == "__main__":
    unittest.main()
