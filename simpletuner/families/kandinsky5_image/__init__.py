"""Kandinsky 5.0 Image: spec.py, adapter.py, i2i.py (the i2i flavours), tiny.py."""
