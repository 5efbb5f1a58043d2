"""SimpleTuner's config.json options that have no field here, by topic (see entries.Foreign)."""

from simpletuner.configuration.simpletuner_keys.data import DATA_KEYS
from simpletuner.configuration.simpletuner_keys.families import FAMILY_KEYS
from simpletuner.configuration.simpletuner_keys.model import MODEL_KEYS
from simpletuner.configuration.simpletuner_keys.reporting import REPORTING_KEYS
from simpletuner.configuration.simpletuner_keys.training import TRAINING_KEYS

CONFIG_KEYS = {**MODEL_KEYS, **TRAINING_KEYS, **DATA_KEYS, **REPORTING_KEYS, **FAMILY_KEYS}
