"""SANA-Video: spec.py, flavours.py (torch-free), adapter.py and tiny.py."""
