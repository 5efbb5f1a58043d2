"""Real component settings for tests: built from a real TrainingConfig, as the trainer builds
them, so a renamed or removed option breaks the test instead of passing a stand-in."""

from __future__ import annotations

from simpletuner.configuration import TrainingConfig


def training_config(**options) -> TrainingConfig:
    """A TrainingConfig at the options' defaults; the required keys get placeholders."""
    required = {"model_family": "sd1x", "pretrained_model_name_or_path": "builtin:tiny-sd1x",
                "output_dir": "unused-output", "data_backend_config": "unused.json"}
    return TrainingConfig(**{**required, **options})


def settings(kind, **options):
    """``kind`` (e.g. ValidationSettings) read from a TrainingConfig with ``options``."""
    return kind.from_config(training_config(**options))
