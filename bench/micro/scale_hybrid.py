"""``scale_bench --mode hybrid``: documents of 3-5 real corpus sentences in one collection through the
Qdrant-compatible HTTP API, as a new user would load and query them (not in CI; run alone; resumable).

Each point: a client-supplied 384-d dense vector ``dense`` (cosine; a flat index unless ``--index hnsw``), a sparse
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
from bench.micro.scale_report import KINDS, PHASES, Results, ingest_rate, stats, table

NAME = "hybrid"
K = 10
BM25 = "qdrant/bm25"
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


def create(c: httpx.Client, a: argparse.Namespace) -> None:
    """The collection, unless it exists: dense (cosine, flat or HNSW) + bm25 (``modifier: idf``)."""
    if c.get(f"/qdrant/collections/{NAME}").status_code == 200:
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


def set_indexes(c: httpx.Client, phase: str, res: Results) -> None:
    """No payload index (``none``) or one per field of ``docs.INDEXES`` (``indexed``); records the build time and
    the ``payload_schema`` the collection then reports."""
    t0 = time.perf_counter()
    for field, schema in docs.INDEXES.items():
        if phase == "none":
            r = c.delete(f"/qdrant/collections/{NAME}/index/{field}?wait=true")
        else:
            r = c.put(f"/qdrant/collections/{NAME}/index?wait=true", json={"field_name": field, "field_schema": schema})
        if r.status_code not in (200, 404):
            raise RuntimeError(f"payload index {field} ({phase}): {r.status_code} {r.text[:300]}")
    secs = round(time.perf_counter() - t0, 2)
    schema = c.get(f"/qdrant/collections/{NAME}").json()["result"].get("payload_schema")
    if f"indexes/{phase}" not in res:
        res.put(f"indexes/{phase}", seconds=secs, payload_schema=schema)


def query_body(
    kind: str, text: str, vec: np.ndarray, flt: dict | None, a: argparse.Namespace, exact: bool, ef: int | None = None
) -> bytes:
    """The Query API body of one query (module docstring), serialised; ``ef``: the dense search's ``hnsw_ef``."""
    dense, doc = vec.tolist(), {"text": text, "model": BM25}
    params = {"hnsw_ef": ef} if ef is not None else None
    if kind == "hybrid":
        pre = [
            {"query": dense, "using": "dense", "limit": a.prefetch, **({"params": params} if params else {})},
            {"query": doc, "using": "bm25", "limit": a.prefetch},
        ]
        body = {"prefetch": [{**p, "filter": flt} if flt else p for p in pre], "query": {"fusion": "rrf"}}
    else:
        body = {"query": dense if kind == "dense" else doc, "using": kind}
        if flt:
            body["filter"] = flt
    if exact:
        body["params"] = {"exact": True}
    elif params and kind == "dense":
        body["params"] = params
    return orjson.dumps({**body, "limit": K, "with_payload": False})


def timed(
    c: httpx.Client, bodies: list[bytes], warmup: int = 3, scores: list | None = None
) -> tuple[np.ndarray, list[list[int]]]:
    """Latencies (ms) and hit ids of ``bodies`` sent one at a time (the first ``warmup`` also sent untimed); each
    answer's hit scores appended to ``scores`` when given."""
    url, hdr = f"/qdrant/collections/{NAME}/points/query", {"content-type": "application/json"}
    for b in bodies[:warmup]:
        c.post(url, content=b, headers=hdr).raise_for_status()
    lat, ids = [], []
    for b in bodies:
        t0 = time.perf_counter()
        r = c.post(url, content=b, headers=hdr)
        lat.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200:
            raise RuntimeError(f"query: {r.status_code} {r.text[:500]}")
        points = r.json()["result"]["points"]
        ids.append([p["id"] for p in points])
        if scores is not None:
            scores.append([p["score"] for p in points])
    return np.asarray(lat), ids


def measure(c: httpx.Client, texts: list[str], Q: np.ndarray, a: argparse.Namespace, res: Results) -> None:
    """Every measurement not in ``res`` yet: the exact truths, then each phase's latencies and recalls."""
    filters = {"none": None} | {f: v[0] for f, v in docs.FILTERS.items()}
    for f, flt in filters.items():
        if f"truth/{f}" not in res:
            lat, ids = timed(c, [query_body("dense", t, q, flt, a, exact=True) for t, q in zip(texts, Q)])
            res.put(f"truth/{f}", ids=ids, **stats(lat))
            print(f"exact dense, filter {f}: {stats(lat)}", flush=True)
    for phase in PHASES:
        todo = [(k, f) for f in filters for k in KINDS if (f != "none" or phase == "none")]
        todo = [(k, f) for k, f in todo if f"lat/{phase}/{k}/{f}" not in res]
        if not todo:
            continue
        set_indexes(c, phase, res)
        for kind, f in todo:
            lat, ids = timed(c, [query_body(kind, t, q, filters[f], a, exact=False) for t, q in zip(texts, Q)])
            rec = stats(lat) | {"hits": round(float(np.mean([len(x) for x in ids])), 2)}
            if f != "none":
                rec["only_matching"] = all(docs.FILTERS[f][2](i) for x in ids for i in x)
            if kind == "dense":
                truth = res.get(f"truth/{f}")["ids"]
                rec["recall_at_10"] = round(
                    float(np.mean([len(set(g) & set(t)) / max(len(t), 1) for g, t in zip(ids, truth)])), 4
                )
            res.put(f"lat/{phase}/{kind}/{f}", **rec)
            print(f"{phase:8} {kind:7} {f:5} {rec}", flush=True)


def measure_ef(c: httpx.Client, texts: list[str], Q: np.ndarray, a: argparse.Namespace, res: Results) -> None:
    """Unfiltered dense (its recall@10 against exact search by ids, and by score: hits scoring at least the exact
    10th score, so ties count) and hybrid queries at each ``--hnsw-ef``: the HNSW graph's search breadth against
    latency (``ef/<ef>/<kind>`` in the results)."""
    if "truth/none" not in res or "truth_kth/none" not in res:  # one exact pass gives both
        got: list = []
        lat, ids = timed(c, [query_body("dense", t, q, None, a, exact=True) for t, q in zip(texts, Q)], scores=got)
        if "truth/none" not in res:
            res.put("truth/none", ids=ids, **stats(lat))
        res.put("truth_kth/none", kth=[x[-1] if len(x) == K else None for x in got])
    truth, kth = res.get("truth/none")["ids"], res.get("truth_kth/none")["kth"]
    for ef in a.hnsw_ef:
        for kind in ("dense", "hybrid"):
            if f"ef/{ef}/{kind}" in res:
                continue
            got = []
            lat, ids = timed(c, [query_body(kind, t, q, None, a, False, ef) for t, q in zip(texts, Q)], scores=got)
            rec = stats(lat)
            if kind == "dense":
                rec["recall_at_10"] = round(float(np.mean([len(set(g) & set(t)) / K for g, t in zip(ids, truth)])), 4)
                by_score = [sum(v >= b - 1e-6 for v in x) / K for x, b in zip(got, kth) if b is not None]
                rec["recall_by_score"] = round(float(np.mean(by_score)), 4)
            res.put(f"ef/{ef}/{kind}", **rec)
            print(f"hnsw_ef {ef:5} {kind:7} {rec}", flush=True)
    head = "| hnsw_ef | dense recall@10 (ids) | (by score) | dense p50 / p95 ms | hybrid p50 / p95 ms |"
    print(f"\n{head}\n|---:|---:|---:|---:|---:|")
    for ef in a.hnsw_ef:
        d, h = res.get(f"ef/{ef}/dense") or {}, res.get(f"ef/{ef}/hybrid") or {}
        cells = [d.get("recall_at_10", "—"), d.get("recall_by_score", "—")]
        cells += [f"{x.get('p50_ms', '—')} / {x.get('p95_ms', '—')}" for x in (d, h)]
        print(f"| {ef} | {' | '.join(map(str, cells))} |")


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
        )
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
    ap.add_argument("--index", choices=("flat", "hnsw"), default="flat", help="the dense vector's index")
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
