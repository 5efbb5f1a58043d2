"""A SimpleTuner-style diffusion fine-tuning trainer with exactly-once distributed data."""

from simpletuner.common.quiet_libraries import quiet_libraries

__version__ = "0.1.0"

# Before any entry point imports torch, diffusers or transformers: their noise is logged while
# they are imported.
quiet_libraries()
