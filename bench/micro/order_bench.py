"""Cost of Qdrant's ``order_by`` and ``sample: random`` (service.collections.ordering): both read every matching
point through the backend's scroll (no payload index), so their time grows with the matching points.

A fresh service (embedded backend), one /qdrant collection of ``--points`` points (2-d client vectors: the read's
cost alone) whose payloads hold an integer, a float, an array of integers and a datetime string; then each request
``--repeat`` times. Prints ms per request (median) and µs per matching point, beside a count of the same points (one
SQL scan) for scale.

    python -m bench.micro.order_bench --points 100000 --json data/bench/order_bench.json
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx

from bench.lib import REPO
from bench.lib.machine import cpu_model, write_json
from bench.lib.server import run_server

HALF = {"must": [{"key": "g", "range": {"lt": 5}}]}  # about half of the points
REQUESTS = {
    "count (one SQL scan, for scale)": ("count", {"exact": True}),
    "count, half": ("count", {"exact": True, "filter": HALF}),
    "scroll order_by n (int) limit 10": ("scroll", {"order_by": "n", "limit": 10}),
    "scroll order_by x (float) desc, limit 100": ("scroll", {"order_by": {"key": "x", "direction": "desc"}, "limit": 100}),
    "scroll order_by at (datetime) limit 10": ("scroll", {"order_by": "at", "limit": 10}),
    "scroll order_by arr (array) limit 10": ("scroll", {"order_by": "arr", "limit": 10}),
    "scroll order_by n, half, limit 10": ("scroll", {"order_by": "n", "limit": 10, "filter": HALF}),
    "query sample random limit 10": ("query", {"query": {"sample": "random"}, "limit": 10}),
    "query sample random, half, limit 10": ("query", {"query": {"sample": "random"}, "limit": 10, "filter": HALF}),
}  # fmt: skip


def points(lo: int, hi: int, rng: random.Random) -> list[dict]:
    t0 = datetime(2000, 1, 1)
    return [{"id": i, "vector": {"v": [rng.random(), rng.random()]},
             "payload": {"g": i % 10, "n": rng.randint(0, 10**6), "x": rng.random(),
                         "arr": [rng.randint(0, 999) for _ in range(rng.randint(0, 3))],
                         "at": (t0 + timedelta(seconds=rng.randint(0, 10**8))).isoformat() + "Z"}}
            for i in range(lo, hi)]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as d, run_server(REPO / "models", workdir=Path(d)) as server:
        base = f"{server.url}/qdrant/collections/ordered"
        c = httpx.Client(timeout=600)
        c.put(base, json={"vectors": {"v": {"size": 2, "distance": "Dot"}}}).raise_for_status()
        rng = random.Random(0)
        t = time.perf_counter()
        for lo in range(0, a.points, 1000):
            c.put(
                f"{base}/points?wait=true", json={"points": points(lo, min(a.points, lo + 1000), rng)}
            ).raise_for_status()
        print(f"{a.points} points upserted in {time.perf_counter() - t:.1f} s", flush=True)
        for name, (route, body) in REQUESTS.items():
            times = []
            for _ in range(a.repeat):
                t = time.perf_counter()
                r = c.post(f"{base}/points/{route}", json=body)
                times.append(time.perf_counter() - t)
                r.raise_for_status()
            matching = a.points // 2 if "filter" in body else a.points
            ms = statistics.median(times) * 1000
            rows.append({"request": name, "ms": ms, "us_per_point": ms * 1000 / matching, "points": matching})
            print(f"  {name}: {ms:.1f} ms", flush=True)
    load1 = os.getloadavg()[0]
    print(f"\n{cpu_model()}, {a.points} points, median of {a.repeat}; load average {load0:.2f} -> {load1:.2f}")
    print("| request | ms (median) | µs per matching point |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['request']} | {r['ms']:.1f} | {r['us_per_point']:.2f} |")
    write_json(a.json, {"cpu": cpu_model(), "points": a.points, "load": [load0, load1], "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
