"""Parallelism beyond data parallel: ``sequence.py``, context parallel's sequence-parallel
(Ulysses) attention for the families whose spec names ``attention_heads_key``."""
