"""LongCat-Image: spec.py, adapter.py, edit.py (model_flavour edit), tiny.py."""
