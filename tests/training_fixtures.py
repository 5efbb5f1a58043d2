"""Tiny end-to-end training runs for the trainer tests: a generated dataset, a config, and a
bounded launch of the real entry point (`python -m simpletuner.train` or ./train.sh)."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image, ImageDraw

from launching import REPO, run_bounded

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
           "yellow": (240, 210, 40)}


def make_shapes(folder: Path, per_size: int = 8,
                sizes: tuple[tuple[int, int], ...] = ((64, 64), (96, 64))) -> list[str]:
    """``per_size`` captioned images of each (width, height); returns the sample ids."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(COLOURS)
    ids = []
    for w, h in sizes:
        for i in range(per_size):
            fg, bg = names[i % 4], names[(i + 1 + i // 4) % 4]
            image = Image.new("RGB", (w, h), COLOURS[bg])
            ImageDraw.Draw(image).ellipse((w // 4, h // 4, 3 * w // 4, 3 * h // 4),
                                          fill=COLOURS[fg])
            name = f"{w}x{h}-{i:02d}"
            image.save(folder / f"{name}.png")
            (folder / f"{name}.txt").write_text(f"a {fg} circle on a {bg} background")
            ids.append(f"{name}.png")
    return ids


def write_config(root: Path, data_dir: Path, name: str = "config", datasets: list | None = None,
                 **options) -> Path:
    """config.json + multidatabackend.json under ``root``; output goes to root/<name>-out."""
    backend = root / f"{name}-multidatabackend.json"
    backend.write_text(json.dumps(datasets or [
        {"id": "shapes", "instance_data_dir": str(data_dir), "caption_strategy": "textfile"}]))
    config = {
        "model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
        "output_dir": str(root / f"{name}-out"), "data_backend_config": str(backend),
        "seed": 7, "resolution": 64, "aspect_bucket_alignment": 16, "train_batch_size": 2,
        "max_train_steps": 4, "learning_rate": 1e-3, "validation_resolution": 64,
    }
    config.update(options)
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def config_problems(folder: Path, **options) -> str:
    """The ConfigError's text of a config.json with ``options`` (and a dataset file naming
    ``folder``, output under it) written into ``folder``; AssertionError if it loads."""
    from simpletuner.configuration import ConfigError, load_configuration

    (folder / "backend.json").write_text(json.dumps([{"id": "d", "instance_data_dir": str(
        folder)}]))
    config = folder / "config.json"
    config.write_text(json.dumps({"output_dir": str(folder / "out"),
                                  "data_backend_config": str(folder / "backend.json"),
                                  **options}))
    try:
        load_configuration(str(config))
    except ConfigError as error:
        return str(error)
    raise AssertionError(f"{options} loaded without a problem")


def environment(tmpdir: str, fresh_model_cache: bool = False) -> dict[str, str]:
    """``fresh_model_cache``: built-in models are built inside the run, not reused."""
    env = dict(os.environ)
    env["TMPDIR"] = tmpdir
    private_cache = str(Path(tmpdir) / "simpletuner-cache")
    if fresh_model_cache:
        env["SIMPLETUNER_CACHE"] = private_cache
    else:
        env.setdefault("SIMPLETUNER_CACHE", private_cache)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_training(config: Path, tmpdir: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_bounded([sys.executable, "-m", "simpletuner.train", "--config", str(config)],
                       tmpdir=tmpdir, env=environment(tmpdir), timeout=timeout)


def run_train_sh(config: Path, tmpdir: str, timeout: int = 400,
                 fresh_model_cache: bool = False) -> subprocess.CompletedProcess:
    return run_bounded([REPO / "train.sh", config], tmpdir=tmpdir,
                       env=environment(tmpdir, fresh_model_cache), timeout=timeout)


SEQUENCE_RUNNER = Path(__file__).with_name("training_sequence_runner.py")


def run_sequence(configs: list[Path], tmpdir: str, num_processes: int = 2,
                 timeout: int = 400) -> subprocess.CompletedProcess:
    """The runs of ``configs``, one after the other, by the ``num_processes`` processes of one
    torchrun launch (training_sequence_runner.py): for runs compared with each other, which
    need not each pay for a launch (the launchers are tested in test_train_sh.py)."""
    env = dict(environment(tmpdir), ACCELERATE_USE_CPU="true")
    return run_bounded([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", str(num_processes), SEQUENCE_RUNNER,
                        *map(str, configs)], tmpdir=tmpdir, env=env, timeout=timeout)


def run_in_process(config: Path, tmpdir: str | None = None):
    """The run of ``config`` by a Trainer built in this process: its TrainingResult, or the
    run's own exception. For tests of what a run does, not of how it is launched (no
    interpreter, torch or launcher start-up; the launchers have their own tests:
    test_train_sh.py, and the TrainingRuns classes that launch through ./train.sh)."""
    from accelerate import Accelerator

    from simpletuner.configuration import load_configuration
    from simpletuner.training.recipe import Trainer

    return Trainer(load_configuration(config), Accelerator(cpu=True)).run()


def run_in_process_logged(config: Path, tmpdir: str | None = None) -> subprocess.CompletedProcess:
    """``run_in_process`` told as a process's outcome, for tests written against one: status 0,
    or 1 with the run's exception last in ``stderr``; ``stderr`` holds the trainer's log lines
    (its loggers at INFO, as a run prints them)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    # As simpletuner.train formats them (its configure_logging).
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    trainer_logger = logging.getLogger("simpletuner")
    level = trainer_logger.level
    trainer_logger.addHandler(handler)
    trainer_logger.setLevel(logging.INFO)
    status = 0
    try:
        run_in_process(config)
    except Exception as exc:  # the run's own failure, reported as the process would
        stream.write(f"{type(exc).__name__}: {exc}\n")
        status = 1
    finally:
        trainer_logger.removeHandler(handler)
        trainer_logger.setLevel(level)
    return subprocess.CompletedProcess([str(config)], status, "", stream.getvalue())


def check_recording_torch(config: Path, tmpdir: str | Path) -> subprocess.CompletedProcess:
    """``python -m simpletuner check`` in a fresh interpreter that prints, on its stdout,
    whether torch got imported and check's status (train.sh runs check before accelerate, so
    it must stay torch-free)."""
    code = ("import sys; from simpletuner.cli import main; "
            f"status = main(['check', '--config', {str(config)!r}]); "
            "print('torch' in sys.modules, status)")
    return run_bounded([sys.executable, "-c", code], tmpdir=tmpdir,
                       env=environment(str(tmpdir)), timeout=300)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_events(output_dir: Path, event_type: str) -> list[dict]:
    """The lines of one ``type`` in output_dir/events.jsonl, in the file's order."""
    return [event for event in read_jsonl(output_dir / "events.jsonl")
            if event["type"] == event_type]


def copy_checkpoint(root: Path, run: str, name: str, step: int = 2) -> bool:
    """Put a copy of run ``run``'s checkpoint-<step> into run ``name``'s output folder (both
    under ``root`` as <run>-out), so that ``name`` started with resume_from_checkpoint "latest"
    resumes from it. False when ``run`` left no such checkpoint (it failed)."""
    checkpoint = root / f"{run}-out" / f"checkpoint-{step}"
    if not checkpoint.is_dir():
        return False
    shutil.copytree(checkpoint, root / f"{name}-out" / checkpoint.name)
    return True


class TrainingRuns:
    """Mixed into a TestCase: the class's training runs, started once by its ``start_runs``,
    each writing <name>.json and <name>-out under one temporary folder ``root`` (``tmp``), which
    is removed after the class, also when ``start_runs`` fails. Every run's config is
    ``options`` under its own, with ``datasets`` (root/data's images when None) unless it
    names its own, and ``launch`` runs it (./train.sh unless the class says otherwise)."""

    tmp_prefix: str
    options: dict = {}
    datasets: list | None = None
    launch = staticmethod(run_train_sh)

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp(prefix=cls.tmp_prefix)
        cls.addClassCleanup(shutil.rmtree, cls.tmp, ignore_errors=True)
        cls.root = Path(cls.tmp)
        cls.start_runs()

    @classmethod
    def start_runs(cls):
        raise NotImplementedError(f"{cls.__name__} starts no runs")

    @classmethod
    def train(cls, name: str, launch=None, **options) -> subprocess.CompletedProcess:
        """Run ``name`` with ``launch`` (the class's unless given)."""
        options = {"datasets": cls.datasets, **cls.options, **options}
        config = write_config(cls.root, cls.root / "data", name, **options)
        return (launch or cls.launch)(config, cls.tmp)

    @classmethod
    def train_resumed(cls, run: str, name: str, step: int = 2, launch=run_training,
                      **options) -> subprocess.CompletedProcess | None:
        """Run ``name`` resumed ("latest") from a copy of run ``run``'s checkpoint-<step>; None
        when ``run`` left no such checkpoint (it failed, which its own tests report). It runs
        the trainer's entry point unless ``launch`` says otherwise: the first run tested the
        class's launcher, which a resumed run would only start again."""
        if not copy_checkpoint(cls.root, run, name, step):
            return None
        return cls.train(name, launch, resume_from_checkpoint="latest", **options)

    @classmethod
    def train_and_resume(cls, name: str, resumed_name: str = "", launch=run_training,
                         **options) -> tuple[subprocess.CompletedProcess, ...]:
        """Run ``name``, then the same run resumed from a copy of its checkpoint-2
        (``resumed_name``, <name>-resumed unless given; ``launch`` as for train_resumed): the
        two results, the second None when the first left no checkpoint."""
        first = cls.train(name, **options)
        return first, cls.train_resumed(name, resumed_name or f"{name}-resumed", launch=launch,
                                        **options)

    @classmethod
    def train_full_and_lora(cls, full: dict | None = None, **lora) -> None:
        """The four runs most family tests read: ``full`` (a full run, options ``full``) and
        ``lora`` (model_type lora, options ``lora``), each with its twin resumed from a copy of
        its checkpoint-2 (``resumed``, ``lora_resumed``)."""
        cls.full, cls.resumed = cls.train_and_resume("full", "resumed", **(full or {}))
        cls.lora, cls.lora_resumed = cls.train_and_resume("lora", model_type="lora", **lora)


class ResumedRunPair(TrainingRuns):
    """Mixed into a TestCase: a run with ``options`` on ``per_size`` shapes per size (``full``,
    output in ``full_out``), then, if it succeeded, a run resumed ("latest") from a copy of its
    checkpoint-``resume_step`` (``resumed``, output in ``resumed_out``)."""

    per_size: int
    resume_step: int
    launch = staticmethod(run_training)  # or run_train_sh

    @classmethod
    def start_runs(cls):
        make_shapes(cls.root / "data", per_size=cls.per_size)
        cls.full_out, cls.resumed_out = cls.root / "full-out", cls.root / "resumed-out"
        cls.full = cls.train("full")
        cls.resumed = cls.train_resumed("full", "resumed", cls.resume_step, cls.launch)


class ReportView(HTMLParser):
    """What a training_report.html (or a browser's dump of its DOM) shows: the status, each
    curve's plotted (step, value) points by series name, the steps marked non-finite, every
    image's src, every bucket bar's count (dataset order), and all links."""

    def __init__(self, html: str):
        super().__init__()
        self.status, self.series, self.nonfinite = None, {}, []
        self.images, self.buckets, self.links = [], [], []
        self._in_status = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if attributes.get("id") == "status":
            self._in_status = True
        if "series" in classes:
            steps = [int(s) for s in attributes["data-steps"].split()]
            values = [float(v) for v in attributes["data-values"].split()]
            self.series[attributes["data-series"]] = list(zip(steps, values))
        if "nonfinite" in classes and tag == "g":
            self.nonfinite = [int(s) for s in attributes["data-steps"].split()]
        if tag == "img":
            self.images.append(attributes["src"])
        if "bar" in classes:
            self.buckets.append((attributes["data-bucket"], int(attributes["data-count"])))
        for name in ("src", "href"):
            if attributes.get(name):
                self.links.append(attributes[name])

    def handle_data(self, data):
        if self._in_status:
            self.status, self._in_status = data.strip(), False


def read_report(output_dir: Path) -> ReportView:
    return ReportView((output_dir / "training_report.html").read_text(encoding="utf-8"))
