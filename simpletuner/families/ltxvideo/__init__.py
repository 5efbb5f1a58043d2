"""LTX-Video 0.9.x (LTXPipeline): spec.py, adapter.py (the adapter), tiny.py (its tiny model)."""
