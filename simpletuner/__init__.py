"""A SimpleTuner-style diffusion fine-tuning trainer with exactly-once distributed data."""

__version__ = "0.1.0"
