"""Time to create and load one collection on the test Milvus (the ``milvus`` 2.3.5 wheel's standalone server), step
by step, with extra server settings: why each Milvus-backed test pays seconds per collection.

Per try, the backend's physical collection (:func:`service.collections.milvus.schema.physical_schema`, 384 dims;
:func:`~service.collections.milvus.schema.index_params` of a flat cosine index), made in the three pymilvus calls
that :func:`~service.collections.milvus.schema.create_physical`'s one ``create_collection(..., index_params=...)``
makes: ``create_collection`` (schema only), ``create_index``,
``load_collection`` (each returns when done); the seconds of each. ``--extra-config key=value`` (repeatable) sets
Milvus settings, e.g. ``queryCoord.checkInterval=100`` (its query coordinator's checker, 1,000 ms by default).

Usage (alone on the machine; ~1 min)::

    python -m bench.milvus.milvus_load_bench [--tries 4] [--extra-config queryCoord.checkInterval=100]

Not a test: it asserts nothing, it prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.lib.machine import cpu_model
from harness.milvus import milvus_client, milvus_server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tries", type=int, default=4)
    ap.add_argument("--extra-config", action="append", default=[], help="a Milvus setting key=value (repeatable)")
    a = ap.parse_args()
    from service.collections.index import IndexSpec
    from service.collections.milvus.schema import index_params, physical_schema

    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as d, milvus_server(Path(d), extra_config=tuple(a.extra_config)) as server:
        c = milvus_client(server.uri, server.token)
        for i in range(a.tries):
            schema, ip = physical_schema(384), index_params(c, IndexSpec("flat", "cosine", {}, 384))
            t = [time.perf_counter()]
            c.create_collection(f"c{i}", schema=schema)
            t.append(time.perf_counter())
            c.create_index(f"c{i}", ip)
            t.append(time.perf_counter())
            c.load_collection(f"c{i}")
            t.append(time.perf_counter())
            rows.append([b - a for a, b in zip(t, t[1:])])
        c.close()
    print(f"CPU: {cpu_model()}; Milvus extra config: {a.extra_config or 'none'}\n")
    print("| try | create_collection s | create_index s | load_collection s |")
    print("|---:|---:|---:|---:|")
    for i, (cr, ix, ld) in enumerate(rows, 1):
        print(f"| {i} | {cr:.2f} | {ix:.2f} | {ld:.2f} |")
    print(f"\nload average before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
