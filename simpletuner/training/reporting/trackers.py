"""Trackers by SimpleTuner's `report_to` names: tensorboard, wandb, all, none.

accelerate runs them (only the main process logs). wandb runs offline, into output_dir/wandb/,
unless the user has configured it online (WANDB_API_KEY or WANDB_MODE): this machine may have no
network, and a run must never stop or hang because a tracker cannot reach its server.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

TRACKERS = {"none": (), "tensorboard": ("tensorboard",), "wandb": ("wandb",),
            "all": ("tensorboard", "wandb")}
WANDB_INSTALL = "pip install 'simpletuner[wandb]'"


def tracker_names(report_to: str) -> tuple[str, ...]:
    return TRACKERS[report_to]


def tracker_problems(report_to: str) -> list[str]:
    """What the configured trackers need that is not installed (for the preflight report)."""
    if "wandb" in tracker_names(report_to) and importlib.util.find_spec("wandb") is None:
        return [f"key 'report_to' is '{report_to}', which needs wandb; run {WANDB_INSTALL}"]
    return []


def wandb_settings(training) -> dict:
    """wandb.init keyword arguments: the run name, output_dir as its folder, offline unless
    the user configured wandb to be online."""
    settings = {"dir": str(Path(training.output_dir)), "name": training.tracker_run_name}
    if not (os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE")):
        settings["mode"] = "offline"
    return settings


def start_trackers(accelerator, training) -> None:
    """Start the configured trackers; call on every rank (accelerate logs from the main one)."""
    if not tracker_names(training.report_to):
        return
    if "wandb" in tracker_names(training.report_to):
        Path(training.output_dir).mkdir(parents=True, exist_ok=True)
    accelerator.init_trackers(training.tracker_project_name,
                              init_kwargs={"wandb": wandb_settings(training)})


def log_images(accelerator, images: dict, step: int) -> None:
    """Validation images (name -> PIL image) to every running tracker that shows images."""
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.log_images({k: np.asarray(v) for k, v in images.items()}, step=step,
                               dataformats="HWC")
        elif tracker.name == "wandb":  # a list of images per key
            tracker.log_images({k: [v] for k, v in images.items()}, step=step)
