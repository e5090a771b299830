"""What the tests and the benchmarks both start: a real Milvus standalone server in a network namespace of its own
(:mod:`harness.milvus`, :mod:`harness.milvus_netns`) and free loopback ports (:mod:`harness.ports`).

Not installed and not shipped (neither the wheel nor the images carry it): ``tests/`` and ``bench/`` import it from
the repository root, which is on the import path when they run from there (``python -m pytest``,
``python -m bench.<group>.<script>``). It imports neither ``tests`` nor ``bench``.
"""
