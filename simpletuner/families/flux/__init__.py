"""FLUX.1: spec.py, adapter.py, kontext.py (model_flavour kontext), tiny.py."""
