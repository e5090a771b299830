"""``scale_bench --mode hybrid``: documents of 3-5 real corpus sentences in one collection through the
Qdrant-compatible HTTP API, as a new user would load and query them (not in CI; run alone; resumable).

Each point: a client-supplied 384-d dense vector ``dense`` (cosine; a flat index unless ``--index hnsw``, or an index
Qdrant does not have, ``ivf_sq`` / ``ivf_pq`` with ``--index-params``, the collection then created through the native
API with the same vectors; the queries wait until its index is trained, and the time it took is recorded), a sparse
vector ``bm25`` made by the service from the document's text (``{"text", "model": "qdrant/bm25"}``, the collection's
sparse vector with ``modifier: idf``) and a payload ``{category, year, tag}`` (:mod:`bench.micro.scale_docs`).
Upserts: ``PUT /qdrant/collections/hybrid/points?wait=true``, ``--batch`` documents each, ``--writers`` at once.

Queries (``--queries`` held-out corpus sentences, 1 client, top 10, no payload returned), each unfiltered, with the
1 % filter (``category``) and the 0.1 % filter (``tag``), ``POST /qdrant/collections/hybrid/points/query``:

* dense: ``{"query": [384 floats], "using": "dense"}``;
* BM25: ``{"query": {"text", "model": "qdrant/bm25"}, "using": "bm25"}``;
* hybrid: both as ``prefetch`` (``--prefetch`` hits each, the filter in each) fused by ``{"fusion": "rrf"}``;
* exact dense (``"params": {"exact": true}``): the truth recall@10 of dense is measured against, per filter;
* with ``--hnsw-ef``: unfiltered dense and hybrid with the dense search's ``"params": {"hnsw_ef": ef}``, per ef;
  dense recall@10 both by ids and by score (hits scoring at least the exact search's 10th score: ties count).

The filtered ones twice: without payload indexes (each ``DELETE /qdrant/collections/hybrid/index/{field}``), then
with them (``PUT /qdrant/collections/hybrid/index?wait=true`` for category, tag, year; the answer's
``payload_schema`` is recorded, so a server that accepts and ignores them shows it). Also: ingest documents/s
(acknowledged documents over the wall time of the sessions that sent them), disk (``du`` of the server's data
directory), the server's RSS (``VmRSS`` / ``VmHWM``) after ingest and after the queries.

Resumable: the work directory (``--work``, default ``~/.cache/embed-bench/scale_hybrid/<N>-<dense>-<index>``)
holds the server's data, ``ingest.jsonl`` (one line per acknowledged upsert: a rerun sends only the others) and
``results.jsonl`` (one line per finished measurement: a rerun skips it; delete a line to measure it again).
``--fresh`` deletes the work directory; the dense vectors' cache (``--cache-dir``) is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.lib import REPO
from bench.lib.machine import cpu_model
from bench.micro import scale_docs as docs
from bench.micro.scale_queries import BM25, NAME, measure, measure_ef
from bench.micro.scale_report import Results, ingest_rate, table

AUTO_ENCODER_MAX = 100_000  # --dense auto: the encoder up to this many documents, random projection above


def rss(pid: int) -> dict:
    """The process's ``VmRSS`` and ``VmHWM`` in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = round(int(line.split()[1]) / 1024)
    return {"rss_mib": out.get("VmRSS"), "peak_rss_mib": out.get("VmHWM")}


def du_mib(path: Path) -> int:
    """``du -sk`` of ``path`` in MiB."""
    return round(int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()[0]) / 1024)


def prepare_vectors(dv: docs.DenseVectors, n_docs: int) -> None:
    """Compute (encoder) the dense vectors of every chunk not cached yet, before the server starts."""
    chunks = -(-n_docs // docs.CHUNK)
    todo = [c for c in range(chunks) if not (dv.dir / f"chunk_{c:05d}.npy").exists()]
    if dv.method != "encoder" or not todo:
        return
    print(f"encoding {len(todo) * docs.CHUNK:,} documents with {dv.artifact.name} -> {dv.dir}", flush=True)
    t0 = time.perf_counter()
    for j, c in enumerate(todo, 1):
        dv.chunk(c)
        rate = j * docs.CHUNK / (time.perf_counter() - t0)
        eta = (len(todo) - j) * docs.CHUNK / rate
        print(f"  chunk {c} ({j}/{len(todo)}): {rate:.1f} documents/s, ~{eta / 60:.0f} min left", flush=True)


#: dense index types Qdrant's API cannot name: the collection is created through the native API
NATIVE_INDEXES = ("ivf_sq", "ivf_pq")


def create(c: httpx.Client, a: argparse.Namespace) -> None:
    """The collection, unless it exists: dense (cosine, flat or HNSW; ``NATIVE_INDEXES`` through the native API) +
    bm25 (``modifier: idf``)."""
    if c.get(f"/qdrant/collections/{NAME}").status_code == 200:
        return
    if a.index in NATIVE_INDEXES:
        dense = {"size": docs.D, "metric": "cosine", "index": a.index, "params": json.loads(a.index_params)}
        body = {"vectors": {"dense": dense}, "sparse_vectors": {"bm25": {"modifier": "idf"}}}
        r = c.put(f"/collections/{NAME}", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"create {body}: {r.status_code} {r.text}")
        return
    body = {
        "vectors": {"dense": {"size": docs.D, "distance": "Cosine"}},
        "sparse_vectors": {"bm25": {"modifier": "idf"}},
    }
    if a.index == "flat":
        body["hnsw_config"] = {"m": 0}
    body.update(json.loads(a.collection_json))
    r = c.put(f"/qdrant/collections/{NAME}", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"create {body}: {r.status_code} {r.text}")


def ingest(url: str, dv: docs.DenseVectors, a: argparse.Namespace, n_docs: int, work: Path) -> None:
    """Upsert every document not acknowledged in ``ingest.jsonl``, each acknowledgement appended to it."""
    ck = work / "ingest.jsonl"
    recs = [json.loads(x) for x in ck.read_text().splitlines() if x.strip()] if ck.exists() else []
    head = {"batch": a.batch, "seed": a.seed, "dense": a.dense}
    if recs and {k: recs[0].get(k) for k in head} != head:
        raise SystemExit(f"{ck} was written with {recs[0]}, not {head}: same options, or --fresh")
    done = {r["start"] for r in recs if "start" in r}
    todo = [b for b in docs.batches(n_docs, a.batch) if b[1] not in done]
    if not todo:
        return
    session = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"ingest: {len(todo)} upserts to send ({len(done)} acknowledged before)", flush=True)
    lock, local, t0 = threading.Lock(), threading.local(), time.perf_counter()
    log = open(ck, "a", buffering=1)
    if not recs:
        log.write(json.dumps(head) + "\n")

    def put(s: int, e: int, V: np.ndarray, texts: list[str]) -> None:
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=url, timeout=600)
        off = (s // docs.CHUNK) * docs.CHUNK
        pts = [
            {
                "id": i,
                "payload": docs.payload(i),
                "vector": {"dense": V[i - off], "bm25": {"text": texts[i - off], "model": BM25}},
            }
            for i in range(s, e)
        ]
        body = orjson.dumps({"points": pts}, option=orjson.OPT_SERIALIZE_NUMPY)
        r = local.c.put(
            f"/qdrant/collections/{NAME}/points?wait=true", content=body, headers={"content-type": "application/json"}
        )
        if r.status_code != 200:
            raise RuntimeError(f"upsert {s}..{e}: {r.status_code} {r.text[:500]}")
        with lock:
            log.write(json.dumps({"start": s, "end": e, "session": session, "t": time.perf_counter() - t0}) + "\n")

    pending: deque = deque()
    last = (time.perf_counter(), todo[0][1])
    with log, ThreadPoolExecutor(a.writers) as ex:
        chunk, V, texts = -1, None, None
        for j, (c, s, e) in enumerate(todo):
            if c != chunk:
                chunk, V, texts = c, dv.chunk(c), docs.chunk_texts(dv.lines, c, a.seed)
            pending.append(ex.submit(put, s, e, V, texts))
            while len(pending) > 4 * a.writers or (j == len(todo) - 1 and pending):
                pending.popleft().result()
            if time.perf_counter() - last[0] > 30:
                rate = (s - last[1]) / (time.perf_counter() - last[0])
                print(f"  ingest: up to id {s:,}, {rate:,.0f} documents/s", flush=True)
                last = (time.perf_counter(), s)


def wait_trained(c: httpx.Client, timeout_s: float = 3600) -> float:
    """Seconds until the dense vector's index is trained (an IVF index's k-means is maintenance, after the writes
    that reach ``min_train_points``); 0 when it already is.

    Raises:
        RuntimeError: not trained within ``timeout_s``.
    """
    t0 = time.perf_counter()
    while not c.get(f"/collections/{NAME}").json()["vectors"]["dense"]["dense"]["trained"]:
        if time.perf_counter() - t0 > timeout_s:
            raise RuntimeError(f"the dense index is not trained after {timeout_s} s")
        time.sleep(2)
    return round(time.perf_counter() - t0, 1)


def run_one(n_docs: int, a: argparse.Namespace) -> Path:
    """Everything for ``n_docs`` documents (module docstring); returns the work directory."""
    from bench.micro.scale_bench import Server

    dense = a.dense if a.dense != "auto" else ("encoder" if n_docs <= AUTO_ENCODER_MAX else "random-projection")
    work = a.work or Path.home() / ".cache" / "embed-bench" / "scale_hybrid" / f"{n_docs}-{dense}-{a.index}"
    if a.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    res = Results(work / "results.jsonl")
    args = argparse.Namespace(**{**vars(a), "dense": dense})
    if "setup" not in res:
        res.put(
            "setup",
            docs=n_docs,
            dense=dense,
            index=a.index,
            batch=a.batch,
            writers=a.writers,
            seed=a.seed,
            queries=a.queries,
            prefetch=a.prefetch,
            collection_json=a.collection_json,
            index_params=a.index_params,
            search_params=a.search_params,
        )
    elif any(res.get("setup").get(k, "{}") != getattr(a, k) for k in ("index_params", "search_params")):
        raise SystemExit(f"{work} was made with other --index-params / --search-params: --work or --fresh")
    lines = docs.corpus_lines()
    dv = docs.DenseVectors(dense, lines, a.seed, a.cache_dir, Path(a.models_dir) / a.model)
    prepare_vectors(dv, n_docs)
    texts, Q = dv.queries(a.queries)
    load0, t_start = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"N={n_docs:,} dense={dense} work={work} load average before: {load0}", flush=True)
    srv = Server(args, work)
    start_s = srv.start()
    try:
        c = httpx.Client(base_url=srv.url, timeout=600)
        create(c, args)
        if "ingest" not in res:
            ingest(srv.url, dv, args, n_docs, work)
            count = c.post(f"/qdrant/collections/{NAME}/points/count", json={"exact": True}).json()["result"]["count"]
            if count != n_docs:
                raise RuntimeError(f"{count} points after ingest, not {n_docs}")
            res.put("ingest", **ingest_rate(work), points_count=count)
            res.put("after_ingest", disk_mib=du_mib(work / "data"), **rss(srv.proc.pid))
        if "trained" not in res:
            res.put("trained", waited_after_ingest_s=wait_trained(c), **rss(srv.proc.pid))
        if a.hnsw_ef:
            measure_ef(c, texts, Q, args, res)
        if not a.only_ef:
            measure(c, texts, Q, args, res)
        if not res.new:
            return work
        what = ["ingest"] * ("ingest" in res.new) + [
            f"{sum(k.startswith(('lat/', 'truth/', 'ef/')) for k in res.new)} query sets"
        ]
        res.put(
            f"session/{t_start}",
            date=t_start,
            measured=", ".join(what),
            cpu=cpu_model(),
            load_before=load0,
            load_after=os.getloadavg(),
            start_s=start_s,
            after_queries=rss(srv.proc.pid),
            disk_mib=du_mib(work / "data"),
        )
    finally:
        srv.stop()
    return work


def main(argv: list[str]) -> None:
    """Parse ``argv`` (the options after ``--mode hybrid``), run each ``--docs`` and print the tables."""
    ap = argparse.ArgumentParser(
        prog="python -m bench.micro.scale_bench --mode hybrid",
        description="Hybrid search at scale through the Qdrant API (module docstring: bench/micro/scale_hybrid.py).",
    )
    ap.add_argument("--docs", type=int, nargs="+", default=[100_000], help="N documents, one collection each")
    ap.add_argument(
        "--dense",
        choices=("auto", *docs.DENSE_METHODS),
        default="auto",
        help=f"auto: encoder up to {AUTO_ENCODER_MAX:,} documents, random-projection above",
    )
    ap.add_argument(
        "--index", choices=("flat", "hnsw", *NATIVE_INDEXES), default="flat", help="the dense vector's index"
    )
    ap.add_argument("--search-params", default="{}", help="merged into the dense searches' params (JSON)")
    ap.add_argument("--index-params", default="{}", help="the dense index's params (JSON; with ivf_sq / ivf_pq)")
    ap.add_argument("--collection-json", default="{}", help="merged into the create body (quantization_config...)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--prefetch", type=int, default=20, help="hits of each hybrid prefetch")
    ap.add_argument("--batch", type=int, default=500, help="documents per upsert (divides 2,000 to keep them full)")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "embed-bench" / "dense")
    ap.add_argument("--work", type=Path, help="the work directory (one --docs only)")
    ap.add_argument("--fresh", action="store_true", help="delete the work directory first (not the vector cache)")
    ap.add_argument("--hnsw-ef", type=int, nargs="*", default=[], help="unfiltered dense and hybrid at these hnsw_ef")
    ap.add_argument("--skip-unindexed", action="store_true", help="no filtered query without payload indexes")
    ap.add_argument("--only-ef", action="store_true", help="measure only the --hnsw-ef rows")
    ap.add_argument("--table-only", action="store_true", help="print the table of what is finished; start nothing")
    a = ap.parse_args(argv)
    if a.work and len(a.docs) > 1:
        ap.error("--work takes one --docs")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path.home() / ".cache" / "embed-bench" / "scale_hybrid"
    works = []
    for n in a.docs:
        if a.table_only:
            works += [a.work] if a.work else sorted(root.glob(f"{n}-*-{a.index}"))
        else:
            works.append(run_one(n, a))
    print(f"\n`python -m bench.micro.scale_bench --mode hybrid {' '.join(argv)}`\n")
    print(table(works))
