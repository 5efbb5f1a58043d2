"""Wan 2.1 and 2.2: spec.py, flavours.py (torch-free), adapter.py, i2v.py, wan22.py,
lora_layout.py, tiny.py and tiny_wan22.py."""
