"""Qwen-Image: spec.py, adapter.py, edit.py (Qwen-Image-Edit and Plus) with processor.py,
tiny.py."""
