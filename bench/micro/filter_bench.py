"""Payload filter cost on the embedded backend: conditions translated to SQLite's JSON1 functions against Qdrant's
richer conditions, which call the reference code in Python once per row tested (``filter_leaf``).

One collection of ``--points`` points (2-d vectors: the filter's cost alone) with payloads shaped like qdrant-client's
test fixtures (words, a datetime string, a geo point, an array of objects), then each filter counted ``--repeat``
times (``count_matching``: a full scan of the covering index or the table). Prints ms per count and µs per point.

    python -m bench.micro.filter_bench --points 100000 --json data/bench/filter_bench.json
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from bench.lib.machine import cpu_model, write_json
from service.collections.embedded import Collection
from service.collections.filters import parse_filter
from service.collections.index import IndexSpec
from service.collections.schema import VectorsConfig

WORDS = ["ape", "wolf", "cat", "dog", "bee", "fox", "owl", "yak", "elk", "emu"]
FILTERS = {
    "equality (SQL)": {"g": 3},
    "numeric range (SQL)": {"n": {"$gte": 0.25, "$lt": 0.5}},
    "array element (SQL)": {"tags": "fox"},
    "$text (Python)": {"words": {"$text": "fox owl"}},
    "datetime range (Python)": {"at": {"$gte": "2000-03-01T00:00:00Z", "$lt": "2000-06-01T00:00:00+02:00"}},
    "$geo_radius (Python)": {"geo": {"$geo_radius": {"center": {"lat": 50.0, "lon": 10.0}, "radius": 300000}}},
    "$nested (Python)": {"$nested": {"key": "items", "filter": {"w": "cat", "k": {"$lt": 3}}}},
    "SQL and Python ANDed": {"g": 3, "words": {"$text": "fox"}},
}


def payloads(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    t0 = datetime(2000, 1, 1)
    return [
        {
            "g": rng.randint(0, 9),
            "n": rng.random(),
            "tags": rng.sample(WORDS, 3),
            "words": " ".join(rng.sample(WORDS, 3)),
            "at": (t0 + timedelta(seconds=rng.randint(0, 365 * 86400))).isoformat() + "Z",
            "geo": {"lat": rng.uniform(35, 65), "lon": rng.uniform(-10, 30)},
            "items": [{"w": rng.choice(WORDS), "k": rng.randint(0, 9)} for _ in range(rng.randint(0, 3))],
        }
        for _ in range(n)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        spec = IndexSpec("flat", "dot", {}, 2)
        c = Collection.create(Path(tmp) / "c", VectorsConfig.single(spec, {"name": "m", "version": "1", "sha256": "0"}))
        ps = payloads(a.points)
        for s in range(0, a.points, 5000):
            part = ps[s : s + 5000]
            c.upsert(list(range(s, s + len(part))), [""] * len(part), part, np.ones((len(part), 2), np.float32))
        rows = []
        for name, raw in FILTERS.items():
            f = parse_filter(raw)
            times = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                n = c.count_matching(f)
                times.append(time.perf_counter() - t)
            best = min(times)
            rows.append({"filter": name, "matched": n, "ms": best * 1e3, "us_per_point": best * 1e6 / a.points})
        c.close()
    print(
        f"{a.points} points; CPU: {cpu_model()}; load {load_before:.2f} -> {os.getloadavg()[0]:.2f}; best of {a.repeat}"
    )
    print("\n| filter | points matched | ms per count | µs per point |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['filter']} | {r['matched']} | {r['ms']:.0f} | {r['us_per_point']:.2f} |")
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
