"""Cost of the Qdrant-compatible reads that are computed from the collection service's answers (not in CI; run alone).

A real service (embedded backend, the default artifact) with one cosine HNSW collection of ``--points`` random unit
vectors (seed 0) upserted as raw vectors through ``PUT /qdrant/collections/{name}/points`` in batches of 256, each
with a payload ``{genre: one of 10, tags: 2 of 20, row}``. Timed over HTTP, ``--repeat`` times each (median and max,
ms), one client:

* ``query``: a plain vector query, ``limit`` 10 (the baseline);
* ``recommend``: ``{recommend: {positive: [3 ids], negative: [1 id]}}``, ``limit`` 10 (reads the 4 examples' vectors,
  then one search);
* ``groups``: ``POST .../points/query/groups`` by ``genre``, ``limit`` 10 groups of ``group_size`` 3 (searches of 60
  hits, then 4x as many until the groups are full);
* ``facet`` / ``facet+filter``: ``POST .../facet`` on ``tags`` over every point / the points of one genre (reads the
  matching payloads a page at a time: grows with the matching points).

Usage::

    python -m bench.micro.qdrant_bench --points 10000,100000 --repeat 5 --json data/bench/qdrant.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.lib import REPO
from bench.lib.machine import cpu_model, write_json
from bench.lib.points import BATCH, D, fill
from bench.lib.server import run_server


def timed(c: httpx.Client, path: str, body: dict, repeat: int) -> dict:
    """Median and max milliseconds of ``repeat`` POSTs (each must answer 200)."""
    ms = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = c.post(path, json=body)
        ms.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
    return {"median_ms": round(statistics.median(ms), 1), "max_ms": round(max(ms), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="10000,100000", help="collection sizes, comma-separated")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(a.models_dir), workdir=Path(tmp)) as server:
        with httpx.Client(base_url=server.url, timeout=600) as c:
            for n in (int(x) for x in a.points.split(",")):
                name = f"bench{n}"
                upsert_s = fill(c, name, n)
                q = rng.standard_normal(D)
                base = f"/qdrant/collections/{name}"
                cases = {
                    "query": (f"{base}/points/query", {"query": (q / np.linalg.norm(q)).tolist(), "limit": 10}),
                    "recommend": (f"{base}/points/query",
                                  {"query": {"recommend": {"positive": [1, 2, 3], "negative": [4]}}, "limit": 10}),
                    "groups": (f"{base}/points/query/groups",
                               {"query": 5, "group_by": "genre", "limit": 10, "group_size": 3}),
                    "facet": (f"{base}/facet", {"key": "tags", "limit": 10}),
                    "facet+filter": (f"{base}/facet", {"key": "tags", "filter": {"must": [
                        {"key": "genre", "match": {"value": "g3"}}]}}),
                }  # fmt: skip
                for what, (path, body) in cases.items():
                    rows.append({"points": n, "request": what, **timed(c, path, body, a.repeat)})
                    print(rows[-1], flush=True)
                rows.append({"points": n, "request": f"upsert ({BATCH} a batch)", "median_ms": None,
                             "max_ms": None, "points_per_s": round(n / upsert_s)})  # fmt: skip
                c.delete(f"{base}")
    print(f"\nCPU: {cpu_model()}; embedded backend, HNSW (the service's defaults), one client, {a.repeat} runs each\n")
    print("| points | request | median ms | max ms |\n|---:|---|---:|---:|")
    for r in rows:
        if r["median_ms"] is None:
            print(f"| {r['points']:,} | {r['request']}: {r['points_per_s']:,} points/s | | |")
        else:
            print(f"| {r['points']:,} | {r['request']} | {r['median_ms']} | {r['max_ms']} |")
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
