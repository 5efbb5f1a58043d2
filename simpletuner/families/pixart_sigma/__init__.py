"""PixArt Sigma: spec.py, adapter.py, tiny.py."""
