"""Provenance: the sidecar every stage writes beside its outputs (sidecars.py), the
environment locks (envlock.py), and the walk from an artifact back to its inputs (audit.py)."""
