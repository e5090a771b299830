"""Collections backends and replicas benchmark (not in CI; run alone on the machine).

Part 1 — backends, at the backend layer (precomputed vectors, so the storage engine is what is measured): every
corpus sentence (``../shared/data/corpus/en_sentences.txt``, embedded once with the default artifact and cached,
see ``bench/micro/search_bench.py``) but the last ``--queries``, which are the queries. One HNSW cosine collection
(M 32, ef_construction 100, ef_search 64) per backend: ``embedded`` (SQLite + FAISS) and ``milvus`` (a real Milvus
2.3.5 standalone server on this machine). Reported: upsert points/s and p50/p99 per batch of ``--batch`` points
with 1 and 4 writers; search queries/s and p50/p99 (one query per call, top_k 10) with 1 and 4 clients, on Milvus
at each read consistency (strong, bounded, eventual, and session: eventual after the last write's sequence);
recall@10 of each against exact search.

Part 2 — replicas: ``POST /v1/embeddings`` (``--embed-batch`` STS-B sentences a request, base64) through nginx (the
Debian package, round-robin) to 1 and to 2 service replicas, with 4 and 8 clients: sentences/s, p50/p99, and each
replica's RSS. On a 2-core machine a second replica cannot add throughput (each already uses both cores); the point
is the per-replica cost for sizing a cluster.

Usage::

    python -m bench.serving.backend_bench --json data/bench/backends.json        # both parts
    python -m bench.serving.backend_bench --parts replicas --requests 60          # one part, fewer requests
    python -m bench.serving.backend_bench --parts backends --backends milvus --milvus-tick-ms 200   # Milvus's default tick
    python -m bench.serving.backend_bench --parts backends --backends milvus --milvus-uri http://milvus:19530   # a cluster
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.corpus import corpus_embeddings
from bench.lib.server import free_port, run_server
from harness.milvus import milvus_server
from service.collections import open_backend
from service.collections.vector_backend import ReadConsistency, single_config
from service.settings import Settings
from training.data.sts import load_task

K = 10
MODEL = {"name": "all-minilm-l6-v2", "version": "bench", "sha256": "0" * 64}
PARAMS = {"M": 32, "ef_construction": 100, "ef_search": 64}


def _pct(lat: list[float]) -> dict:
    a = np.asarray(lat) * 1000
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2)}


def _closed_loop(n_clients: int, jobs: list, fn) -> dict:
    """Run ``fn(job)`` for every job on ``n_clients`` threads; throughput and latency."""
    lat: list[float] = []
    lock = threading.Lock()
    it = iter(jobs)

    def worker() -> None:
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            t0 = time.perf_counter()
            fn(job)
            with lock:
                lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as ex:
        for f in [ex.submit(worker) for _ in range(n_clients)]:
            f.result()
    return {"calls": len(lat), "seconds": round(time.perf_counter() - t0, 2), **_pct(lat)}


def bench_backend(
    name: str,
    settings: Settings,
    X: np.ndarray,
    Q: np.ndarray,
    exact: np.ndarray,
    batch: int,
    levels: tuple[str, ...] = ("strong",),
) -> dict:
    """Load ``X`` into a fresh HNSW collection of backend ``name`` and time upserts and searches, the searches at
    each read consistency of ``levels`` (``session``: eventual after the last write's sequence)."""
    backend = open_backend(settings)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(backend.start())
    try:
        cname = "bench_" + "".join(ch if ch.isalnum() else "_" for ch in name)[:40]
        c = loop.run_until_complete(
            backend.create(cname, single_config(cname, "hnsw", dict(PARAMS), "cosine", MODEL, X.shape[1]))
        )
        n = len(X)
        cut = n - n // 10  # the last 10 % are loaded by 4 writers at once
        batches = [(i, min(i + batch, cut)) for i in range(0, cut, batch)]
        batches4 = [(i, min(i + batch, n)) for i in range(cut, n, batch)]

        out: dict = {"backend": name, "points": n}
        tokens: list[int] = []

        def up(b: tuple[int, int]) -> None:  # keeps each write's sequence (a read-your-writes token)
            i, j = b
            tokens.append(
                c.upsert(
                    list(range(i, j)), [f"s{k}" for k in range(i, j)], [{"row": k} for k in range(i, j)], X[i:j],
                    model=MODEL,
                )
            )  # fmt: skip

        r1 = _closed_loop(1, batches, up)
        out["upsert_1"] = {**r1, "points_per_s": round(sum(j - i for i, j in batches) / r1["seconds"], 1)}
        r4 = _closed_loop(4, batches4, up)
        out["upsert_4"] = {**r4, "points_per_s": round(sum(j - i for i, j in batches4) / r4["seconds"], 1)}
        assert c.count == n, (c.count, n)
        hits: dict[int, list] = {}
        out["search"] = {}
        for level in levels:
            rc = ReadConsistency("eventual", max(tokens)) if level == "session" else ReadConsistency(level)

            def search(qi: int, rc: ReadConsistency = rc) -> None:
                hits[qi] = [h.id for h in c.search(Q[qi : qi + 1], K, model=MODEL, consistency=rc)[0]]

            out["search"][level] = {}
            for clients in (1, 4):
                r = _closed_loop(clients, list(range(len(Q))), search)
                out["search"][level][clients] = {**r, "queries_per_s": round(len(Q) / r["seconds"], 1)}
            print(level, json.dumps(out["search"][level]), flush=True)
        out["recall_at_10"] = round(float(np.mean([len(set(hits[i]) & set(exact[i])) / K for i in range(len(Q))])), 4)
        loop.run_until_complete(backend.delete(cname))
        return out
    finally:
        loop.run_until_complete(backend.close())
        loop.close()


def part_backends(a: argparse.Namespace) -> list[dict]:
    X, _ = corpus_embeddings(a.cache_dir, a.corpus_limit or None, Path(a.models_dir) / a.model)
    X, Q = X[: -a.queries], X[-a.queries :]
    S = Q @ X.T
    exact = np.argsort(-S, axis=1)[:, :K]
    print(f"points {len(X)}, queries {len(Q)}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "embedded" in a.backends:
            s = Settings(data_dir=str(Path(tmp) / "data"))
            rows.append(bench_backend("embedded", s, X, Q, exact, a.batch))
            print(json.dumps(rows[-1]), flush=True)
        if "milvus" in a.backends:
            levels = tuple(a.levels.split(","))
            if a.milvus_uri:  # a Milvus already running (a cluster to size): its token from the environment
                s = Settings(collections_backend="milvus", collections_milvus_uri=a.milvus_uri,
                             collections_milvus_token=os.environ.get("EMBED_COLLECTIONS_MILVUS_TOKEN"),
                             collections_milvus_prefix="bench_")  # fmt: skip
                rows.append(bench_backend(f"milvus at {a.milvus_uri}", s, X, Q, exact, a.batch, levels))
            else:
                with milvus_server(Path(tmp) / "milvus", tick_ms=a.milvus_tick_ms) as m:
                    s = Settings(collections_backend="milvus", collections_milvus_uri=m.uri,
                                 collections_milvus_token=m.token, collections_milvus_prefix="bench_")  # fmt: skip
                    rows.append(bench_backend(f"milvus (tick {a.milvus_tick_ms} ms)", s, X, Q, exact, a.batch, levels))
            print(json.dumps(rows[-1]), flush=True)
    return rows


NGINX = """worker_processes 1; pid {dir}/nginx.pid; error_log {dir}/error.log;
events {{ worker_connections 256; }}
http {{ access_log off; client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  upstream api {{ {servers} keepalive 16; }}
  server {{ listen 127.0.0.1:{port}; client_max_body_size 4m;
    location / {{ proxy_pass http://api; proxy_http_version 1.1; proxy_set_header Connection ""; }} }} }}
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def part_replicas(a: argparse.Namespace) -> list[dict]:
    import httpx

    p = load_task("STSBenchmark")
    sents = list(dict.fromkeys(p.sent1 + p.sent2))
    reqs = [sents[(i * a.embed_batch) % len(sents) :][: a.embed_batch] for i in range(a.requests)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for n_rep in (1, 2):
            with contextlib_exit() as stack:
                servers = [stack.enter_context(run_server(Path(a.models_dir), workdir=tmp / f"r{n_rep}-{i}"))
                           for i in range(n_rep)]  # fmt: skip
                port, d = free_port(), tmp / f"nginx{n_rep}"
                d.mkdir()
                conf = d / "nginx.conf"
                conf.write_text(
                    NGINX.format(dir=d, port=port, servers=" ".join(f"server 127.0.0.1:{s.port};" for s in servers))
                )
                ng = subprocess.Popen(["nginx", "-c", str(conf), "-g", "daemon off;"])
                stack.callback(lambda ng=ng: (ng.terminate(), ng.wait(10)))
                url = f"http://127.0.0.1:{port}"
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    try:
                        if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(0.2)
                call = _embed_caller(url)

                for r in reqs[:8]:
                    call(r)  # warm-up
                for clients in (4, 8):
                    res = _closed_loop(clients, reqs, call)
                    row = {"replicas": n_rep, "clients": clients, **res,
                           "sent_per_s": round(len(reqs) * a.embed_batch / res["seconds"], 1),
                           "rss_mb": [_rss_mb(s.proc.pid) for s in servers]}  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def _embed_caller(url: str):
    """``call(sentences)``: one base64 ``/v1/embeddings`` request on this thread's own HTTP client."""
    import httpx

    local = threading.local()

    def call(r: list[str]) -> None:
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=url, timeout=300)
        res = local.c.post("/v1/embeddings", json={"input": r, "encoding_format": "base64"})
        res.raise_for_status()
        _ = [np.frombuffer(base64.b64decode(x["embedding"]), "<f4") for x in res.json()["data"]]

    return call


def contextlib_exit():
    from contextlib import ExitStack

    return ExitStack()


def table(backends: list[dict], replicas: list[dict]) -> str:
    out = []
    if backends:
        out += ["| backend | points | upsert 1 writer (points/s, p50/p99 ms per batch) | upsert 4 writers | recall@10 |",
                "|---|---|---|---|---|"]  # fmt: skip
        for r in backends:
            u1, u4 = r["upsert_1"], r["upsert_4"]
            out.append(
                f"| {r['backend']} | {r['points']:,} | {u1['points_per_s']:,.0f} ({u1['p50_ms']}/{u1['p99_ms']}) | "
                f"{u4['points_per_s']:,.0f} ({u4['p50_ms']}/{u4['p99_ms']}) | {r['recall_at_10']} |"
            )
        base = next((r["search"]["strong"][4]["queries_per_s"] for r in backends if r["backend"] == "embedded"), None)
        out += ["", "| backend | read consistency | search 1 client (q/s, p50/p99 ms) | search 4 clients | "
                "4 clients vs embedded |", "|---|---|---|---|---|"]  # fmt: skip
        for r in backends:
            for level, res in r["search"].items():
                s1, s4 = res[1], res[4]
                vs = f"{s4['queries_per_s'] / base:.0%}" if base else "-"
                out.append(
                    f"| {r['backend']} | {level} | {s1['queries_per_s']:,.0f} ({s1['p50_ms']}/{s1['p99_ms']}) | "
                    f"{s4['queries_per_s']:,.0f} ({s4['p50_ms']}/{s4['p99_ms']}) | {vs} |"
                )
    if replicas:
        out += [
            "",
            "| replicas | clients | sentences/s | p50 ms | p99 ms | RSS per replica (MB) |",
            "|---|---|---|---|---|---|",
        ]
        for r in replicas:
            out.append(
                f"| {r['replicas']} | {r['clients']} | {r['sent_per_s']:,.0f} | {r['p50_ms']} | {r['p99_ms']} | {r['rss_mb']} |"
            )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="backends,replicas")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--cache-dir", type=Path, default=REPO / "data" / "bench")
    ap.add_argument("--corpus-limit", type=int, default=0, help="first N corpus sentences (0: all)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--backends", default="embedded,milvus")
    ap.add_argument("--milvus-tick-ms", type=int, default=20, help="Milvus's proxy.timeTickInterval (its default: 200)")
    ap.add_argument(
        "--milvus-uri", help="measure this Milvus instead of starting one (token: $EMBED_COLLECTIONS_MILVUS_TOKEN)"
    )
    ap.add_argument("--levels", default="strong,bounded,eventual,session", help="Milvus read consistencies to time")
    ap.add_argument("--batch", type=int, default=256, help="points per upsert call")
    ap.add_argument("--requests", type=int, default=200, help="embedding requests per replica setting")
    ap.add_argument("--embed-batch", type=int, default=32)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"load average before: {os.getloadavg()}  cpu: {platform.processor() or platform.machine()}", flush=True)
    parts = a.parts.split(",")
    backends = part_backends(a) if "backends" in parts else []
    replicas = part_replicas(a) if "replicas" in parts else []
    print(f"load average after: {os.getloadavg()}")
    print(table(backends, replicas))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"backends": backends, "replicas": replicas}, indent=1))


if __name__ == "__main__":
    main()
