"""Faults: crashes, restarts and hostile clients against the running service."""
