"""HunyuanVideo 1.5: spec.py, flavours.py (torch-free), adapter.py and tiny.py."""
