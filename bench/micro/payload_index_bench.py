"""Payload indexes on the embedded backend: filtered count and filtered dense search with and without an index.

One collection of ``--points`` points (``--dim``-d random unit vectors, flat index) with payloads
``{category: "c<k>" (1 % each), tag: <int> (0.1 % each), year, text}``. Each filter (1 % and 0.1 % selectivity,
alone and ANDed with a range) is counted (``count_matching``) and searched (top 10, one query) ``--repeat`` times
without an index, then again after ``category`` (keyword), ``tag`` (integer) and ``year`` (integer) are indexed.
Prints p50 in ms; the hits with and without the index are checked equal.

    python -m bench.micro.payload_index_bench --points 100000
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib.machine import cpu_model
from service.collections.embedded import Collection
from service.collections.filters import parse_filter
from service.collections.index import IndexSpec
from service.collections.payload_indexes import payload_index
from service.collections.schema import VectorsConfig

MODEL = {"name": "bench", "version": "1", "sha256": "0" * 64}
FILTERS = {
    "1 % keyword": {"category": "c7"},
    "0.1 % integer": {"tag": 123},
    "1 % keyword AND year range": {"category": "c7", "year": {"$gte": 2010}},
    "0.1 % integer OR 0.1 % integer": {"$or": [{"tag": 5}, {"tag": 6}]},
}


def p50(fn, repeat: int) -> tuple[float, object]:
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    rng, r = np.random.default_rng(0), random.Random(0)
    n, d = args.points, args.dim
    with tempfile.TemporaryDirectory() as tmp:
        c = Collection.create(Path(tmp) / "c", VectorsConfig.single(IndexSpec("flat", "cosine", {}, d), MODEL))
        t0 = time.perf_counter()
        for lo in range(0, n, 10_000):
            hi = min(n, lo + 10_000)
            X = rng.standard_normal((hi - lo, d)).astype(np.float32)
            X /= np.linalg.norm(X, axis=1, keepdims=True)
            pays = [
                {"category": f"c{i % 100}", "tag": i % 1000, "year": 1990 + r.randint(0, 34), "text": "x"}
                for i in range(lo, hi)
            ]
            c.upsert(list(range(lo, hi)), ["t"] * (hi - lo), pays, X)
        print(f"{n} points, {d}-d, loaded in {time.perf_counter() - t0:.1f}s; {cpu_model()}, load {os.getloadavg()}")
        q = rng.standard_normal((1, d)).astype(np.float32)
        rows: dict[str, dict[str, float]] = {}
        hits: dict[str, list] = {}
        for phase in ("without", "with"):
            if phase == "with":
                t0 = time.perf_counter()
                for key, schema in (("category", "keyword"), ("tag", "integer"), ("year", "integer")):
                    c.create_payload_index(payload_index(key, schema))
                print(f"3 indexes built in {time.perf_counter() - t0:.1f}s")
            for name, raw in FILTERS.items():
                where = parse_filter(raw)
                count_ms, count = p50(lambda w=where: c.count_matching(w), args.repeat)
                search_ms, found = p50(lambda w=where: [h.id for h in c.search(q, 10, w)[0]], args.repeat)
                rows.setdefault(name, {})[f"count {phase}"] = count_ms
                rows[name][f"search {phase}"] = search_ms
                rows[name]["matched"] = count
                if phase == "without":
                    hits[name] = found
                else:
                    assert found == hits[name], name
        c.close()
    print("\n| filter | matched | count p50 ms without / with | search p50 ms without / with |\n|---|---:|---:|---:|")
    for name, v in rows.items():
        print(
            f"| {name} | {v['matched']:,} | {v['count without']:.1f} / {v['count with']:.2f} | "
            f"{v['search without']:.1f} / {v['search with']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
