"""HunyuanVideo 1.5: spec.py, flavours.py (torch-free), adapter.py (text-to-video), i2v.py
(image-to-video) and tiny.py."""
