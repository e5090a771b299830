"""A filter's allowed ids from the payload indexes: through SQLite (``Store.matching_iids``) against the copies held
in memory (:mod:`service.collections.embedded.held_payload`), on an existing embedded collection (not in CI; run
alone, with no server using the collection).

Opens the collection's store only (no vector index), reads the held copies of its numeric payload indexes (timed),
then answers each ``--filter`` (JSON, the native filter grammar) ``--repeat`` times both ways, checks the answers
agree on the live points, and prints p50/p99 in ms and the copies' bytes. By default the filters of the 10M dense
bench (:mod:`bench.micro.scale_bench`: ``h`` 0.1 %, ``g`` 1 %, ``g < 10`` 10 %).

    python -m bench.micro.held_payload_bench \\
        --collection ~/.cache/redundancy-embed/scale_bench/10m-ivf_pq_fs/data/collections/scale
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from bench.lib.machine import cpu_model
from service.collections.embedded.held_payload import HeldPayloadIndexes
from service.collections.embedded.store import Store
from service.collections.filters import parse_filter

DEFAULT_FILTERS = ['{"h": 7}', '{"g": 7}', '{"g": {"$lt": 10}}']


def timed(fn, repeat: int) -> tuple[float, float, np.ndarray]:
    """``(p50 ms, p99 ms, last answer)`` of ``repeat`` calls."""
    ts, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(ts, 50)), float(np.percentile(ts, 99)), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collection", type=Path, required=True, help="an embedded collection's directory")
    ap.add_argument("--filter", action="append", help="a filter (JSON); repeatable")
    ap.add_argument("--repeat", type=int, default=20)
    a = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} load average before: {os.getloadavg()}  cpu: {cpu_model()}")
    store = Store(a.collection)
    held = HeldPayloadIndexes(store)
    t0 = time.perf_counter()
    held.prepare(wait=3600)
    copies = held._held  # noqa: SLF001 (the bench reports the copies' sizes)
    size = sum(h.every.values.nbytes + h.every.iids.nbytes for h in copies.values())
    size += sum(h.plain.values.nbytes + h.plain.iids.nbytes for h in copies.values() if h.plain is not h.every)
    print(f"copies of {sorted(copies)} read in {time.perf_counter() - t0:.1f} s, {size / 2**20:,.0f} MiB\n")
    print("| filter | allowed ids | SQLite p50 / p99 ms | held p50 / p99 ms |\n|---|---:|---:|---:|")
    for raw in a.filter or DEFAULT_FILTERS:
        where = parse_filter(json.loads(raw))
        s50, s99, want = timed(lambda w=where: store.matching_iids(w), a.repeat)
        h50, h99, got = timed(lambda w=where: held.allowed(w), a.repeat)
        if got is None:
            print(f"| `{raw}` | {len(want):,} | {s50:.1f} / {s99:.1f} | (not held) |")
            continue
        assert np.array_equal(np.intersect1d(got, want), want), raw  # the live matches are all there
        print(f"| `{raw}` | {len(want):,} | {s50:.1f} / {s99:.1f} | {h50:.2f} / {h99:.2f} |")
    store.close()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
