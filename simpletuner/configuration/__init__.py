"""Typed, validated configuration: config.json options and multidatabackend.json datasets."""

from simpletuner.configuration.config_files import write_configuration_files
from simpletuner.configuration.datasets import DatasetConfig
from simpletuner.configuration.errors import ConfigError, Problem
from simpletuner.configuration.loader import (Configuration, configuration_from_data,
                                              load_configuration)
from simpletuner.configuration.options import TrainingConfig

__all__ = ["Configuration", "ConfigError", "DatasetConfig", "Problem", "TrainingConfig",
           "configuration_from_data", "load_configuration", "write_configuration_files"]
