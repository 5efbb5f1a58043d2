"""LTX-2 (LTX2Pipeline), a joint audio-video model: spec.py, adapter.py (the adapter), tiny.py
(its tiny model)."""
