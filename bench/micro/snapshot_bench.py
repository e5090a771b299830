"""What collection snapshots cost (embedded backend; not in CI; run alone).

A real service (the default artifact) with one cosine HNSW collection of ``--points`` random unit vectors (seed 0),
filled through ``PUT /qdrant/collections/{name}/points`` in batches of 256 with a small payload
(``bench/qdrant_bench.fill``). Then, over HTTP, one client each:

* ``create``: ``POST /collections/{name}/snapshots`` (wait), the archive's size against the collection directory's;
* writes meanwhile: a second client upserts 16 points at a time during the snapshot (``upsert during``) and for the
  same number of requests before it (``upsert alone``): median and max latency, ms;
* ``download``: ``GET .../snapshots/{snapshot_name}`` to a file;
* ``recover file://``: ``PUT /collections/{copy}/snapshots/recover`` from the file (unpack, ``quick_check``, open:
  FAISS snapshot loaded, nothing rebuilt) and the first search after it;
* ``recover http://``: the same from the service's own download URL (download + recovery).

Usage::

    python -m bench.micro.snapshot_bench --points 10000,100000 --json data/bench/snapshots.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.lib import REPO
from bench.lib.machine import cpu_model, write_json
from bench.lib.points import D, fill
from bench.lib.server import run_server


def du(path: Path) -> int:
    """Bytes of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def writes(c: httpx.Client, name: str, stop: threading.Event, out: list[float], n_max: int, first_id: int) -> None:
    """Upsert 16 random points at a time until ``stop`` (or ``n_max`` requests); latencies (ms) into ``out``."""
    rng = np.random.default_rng(first_id)
    i = first_id
    while not stop.is_set() and len(out) < n_max:
        x = rng.standard_normal((16, D)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        pts = [
            {"id": i + j, "vector": [round(float(f), 6) for f in v], "payload": {"row": i + j}} for j, v in enumerate(x)
        ]
        t0 = time.perf_counter()
        c.put(f"/qdrant/collections/{name}/points", json={"points": pts}).raise_for_status()
        out.append((time.perf_counter() - t0) * 1000)
        i += 16


def stats(ms: list[float]) -> str:
    return f"{statistics.median(ms):.1f} / {max(ms):.1f}" if ms else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", default="10000,100000", help="collection sizes, comma-separated")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(a.models_dir), workdir=Path(tmp)) as server:
        data = Path(tmp) / "data"
        with httpx.Client(base_url=server.url, timeout=3600) as c, httpx.Client(base_url=server.url, timeout=600) as w:
            for n in (int(x) for x in a.points.split(",")):
                name, copy = f"snap{n}", f"copy{n}"
                fill(c, name, n)
                alone: list[float] = []
                writes(w, name, threading.Event(), alone, 40, 10_000_000)
                during: list[float] = []
                stop = threading.Event()
                t = threading.Thread(target=writes, args=(w, name, stop, during, 10**9, 20_000_000))
                t.start()
                t0 = time.perf_counter()
                r = c.post(f"/collections/{name}/snapshots")
                create_s = time.perf_counter() - t0
                stop.set()
                t.join()
                r.raise_for_status()
                desc = r.json()
                path = data / "snapshots" / name / desc["name"]
                t0 = time.perf_counter()
                with (
                    c.stream("GET", f"/collections/{name}/snapshots/{desc['name']}") as resp,
                    open(Path(tmp) / "dl.snapshot", "wb") as f,
                ):
                    resp.raise_for_status()
                    for chunk in resp.iter_bytes(1 << 20):
                        f.write(chunk)
                download_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                r = c.put(f"/collections/{copy}/snapshots/recover", json={"location": f"file://{path}"})
                recover_s = time.perf_counter() - t0
                r.raise_for_status()
                q = np.random.default_rng(1).standard_normal(D)
                t0 = time.perf_counter()
                c.post(f"/qdrant/collections/{copy}/points/query", json={"query": (q / np.linalg.norm(q)).tolist(),
                                                                        "limit": 10}).raise_for_status()  # fmt: skip
                first_query_ms = (time.perf_counter() - t0) * 1000
                url = f"{server.url}/collections/{name}/snapshots/{desc['name']}"
                t0 = time.perf_counter()
                c.put(f"/collections/{copy}/snapshots/recover", json={"location": url}).raise_for_status()
                recover_http_s = time.perf_counter() - t0
                row = {"points": n, "collection_mib": round(du(data / "collections" / name) / 2**20, 1),
                       "archive_mib": round(desc["size"] / 2**20, 1), "create_s": round(create_s, 2),
                       "upsert_alone_ms": stats(alone), "upsert_during_ms": stats(during), "writes_during": len(during),
                       "download_s": round(download_s, 2), "recover_file_s": round(recover_s, 2),
                       "first_query_ms": round(first_query_ms, 1), "recover_http_s": round(recover_http_s, 2),
                       "count_after": r.json()["count"]}  # fmt: skip
                rows.append(row)
                print(row, flush=True)
                for coll in (name, copy):
                    c.delete(f"/collections/{coll}").raise_for_status()
    print(f"\nCPU: {cpu_model()}; embedded backend, HNSW (the service's defaults), {D} dims\n")
    print(
        "| points | collection MiB | archive MiB | create s | upsert alone ms (median / max) | upsert during "
        "(median / max; requests) | download s | recover file:// s | first query ms | recover http:// s |"
    )
    print("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['points']:,} | {r['collection_mib']} | {r['archive_mib']} | {r['create_s']} | "
              f"{r['upsert_alone_ms']} | {r['upsert_during_ms']}; {r['writes_during']} | {r['download_s']} | "
              f"{r['recover_file_s']} | {r['first_query_ms']} | {r['recover_http_s']} |")  # fmt: skip
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
