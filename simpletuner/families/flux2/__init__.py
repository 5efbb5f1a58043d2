"""FLUX.2 (dev and klein): spec.py, adapter.py, lora_layout.py, tiny.py."""
