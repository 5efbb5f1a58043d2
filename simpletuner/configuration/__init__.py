"""Typed, validated configuration: config.json options and multidatabackend.json datasets."""

from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import ConfigError
from simpletuner.configuration.loader import Configuration, load_configuration
from simpletuner.configuration.options import TrainingConfig

__all__ = ["Configuration", "ConfigError", "DatasetConfig", "TrainingConfig", "load_configuration"]
