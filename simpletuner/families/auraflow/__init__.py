"""AuraFlow: spec.py, adapter.py, tiny.py."""
