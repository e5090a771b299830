"""Benchmarks of the service and its training (not in CI): ``python -m bench.<group>.<script> --help``; see bench/README.md."""
