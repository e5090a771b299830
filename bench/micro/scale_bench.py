"""Millions of vectors on one box: the embedded backend (SQLite + FAISS IVF-PQ) loaded through the real HTTP API, then
measured (not in CI; run alone on the machine; resumable).

Vectors (384-d, unit length) with the structure of real text: the corpus's sentence embeddings
(``../shared/data/corpus/en_sentences.txt``, embedded once with the default artifact and cached, see
``bench/micro/search_bench.py``) are mixed: point ``i`` is ``a·x_p + (1−a)·x_q + ε`` renormalised, with ``p, q`` random
corpus sentences, ``a ~ U(0.5, 1)`` (the point stays nearest its first sentence) and ``ε ~ N(0, 0.02²)`` per
coordinate; a deterministic function of ``(seed, i)``, generated in chunks (10M points are never all in memory
here). Embedding 10M sentences on 2 cores would take ~20 hours (~136 sentences/s measured on the corpus), so the
points are derived, not embedded; their texts are empty (a point given as a vector), their payload is
``{"g": i % 100, "h": i % 1000}`` (for filtered search: ``{"h": 7}`` 0.1 % of the points, ``{"g": 7}`` 1 %,
``{"g": {"$lt": 10}}`` 10 %). Queries: 1,000 real corpus sentence
embeddings (the corpus's last 1,000 lines, never mixed into points).

Measured: ingest (``PUT /collections/{name}/points`` with vectors, ``--batch`` points per request, ``--writers`` at
once; the collection trains IVF-PQ once it holds ``min_train_points``), disk (``du`` of the collection), server RSS
(now and peak, ``VmHWM``), start-up after a clean stop (snapshot load + replay) and after SIGKILL, search p50/p99 at
1 and 4 clients (top_k 10, vector queries, over HTTP), recall@10 against exact search on ``--truth`` queries (ground
truth computed by regenerating every chunk), and filtered search at 0.1, 1 and 10 % (p50/p99 at 1 client) with
its recall against exact filtered search, with integer payload indexes on ``g`` and ``h`` (built after the ingest,
timed). Prints a markdown table (date, CPU, load average before and after).

Resumable: the server's data lives in ``--work`` (default ``~/.cache/redundancy-embed/scale_bench/<points>``);
a rerun continues the ingest from the collection's count (ids are deterministic; upserts are idempotent) and
reuses the ground truth (``truth.npz``) and finished measurements (``results.json``).

Usage::

    python -m bench.micro.scale_bench --points 10000000          # ~1-2 h on 2 cores
    python -m bench.micro.scale_bench --points 300000 --truth 50  # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.corpus import corpus_embeddings
from bench.lib.machine import cpu_model
from bench.lib.server import free_port, service_command, wait_ready
from bench.micro.scale_payload import payload_indexes
from bench.micro.scale_report import dense_table

NAME = "scale"
K = 10
CHUNK = 100_000  # points generated at a time
NOISE = 0.02


def generate(X: np.ndarray, start: int, stop: int, seed: int) -> np.ndarray:
    """Points ``start..stop-1``, float32 ``(stop - start, d)``, unit length: each 100k-point chunk is drawn from its
    own generator (``default_rng((seed, chunk))``), so any range is reproducible without the ones before it."""
    out = []
    for c in range(start // CHUNK, (stop - 1) // CHUNK + 1):
        rng = np.random.default_rng((seed, c))
        n = CHUNK
        p, q = rng.integers(0, len(X), n), rng.integers(0, len(X), n)
        a = rng.uniform(0.5, 1.0, (n, 1)).astype(np.float32)
        v = a * X[p] + (1 - a) * X[q] + rng.normal(0, NOISE, (n, X.shape[1])).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        lo, hi = max(start, c * CHUNK) - c * CHUNK, min(stop, (c + 1) * CHUNK) - c * CHUNK
        out.append(v[lo:hi])
    return np.concatenate(out)


#: the filters measured: name -> (native filter, ids -> matching mask)
FILTERS = {
    "0.1%": ({"h": 7}, lambda ids: ids % 1000 == 7),
    "1%": ({"g": 7}, lambda ids: ids % 100 == 7),
    "10%": ({"g": {"$lt": 10}}, lambda ids: ids % 100 < 10),
}


def exact_truth(X: np.ndarray, Q: np.ndarray, n: int, seed: int, each=None) -> dict[str, np.ndarray]:
    """Ids of the exact top-``K`` points (inner product = cosine) for each query over all ``n`` points (``"all"``)
    and over those each of ``FILTERS`` keeps (its name): one pass, each chunk generated once (and handed to
    ``each(ids, vectors)`` when given)."""
    names = ["all", *FILTERS]
    best = [(np.full((len(Q), K), -np.inf, np.float32), np.zeros((len(Q), K), np.int64)) for _ in names]
    for s in range(0, n, CHUNK):
        e = min(n, s + CHUNK)
        V, ids = generate(X, s, e, seed), np.arange(s, e)
        if each is not None:
            each(ids, V)
        keeps = [np.ones(len(ids), bool)] + [f(ids) for _, f in FILTERS.values()]
        for b, (Vb, idb) in enumerate((V[k], ids[k]) for k in keeps):
            S = Q @ Vb.T
            cand_s = np.concatenate([best[b][0], S], axis=1)
            cand_i = np.concatenate([best[b][1], np.broadcast_to(idb, S.shape)], axis=1)
            top = np.argpartition(-cand_s, K, axis=1)[:, :K]
            best[b] = (np.take_along_axis(cand_s, top, 1), np.take_along_axis(cand_i, top, 1))
    return {name: b[1] for name, b in zip(names, best)}


def _rss(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = round(int(line.split()[1]) / 1024)
    return {"rss_mb": out.get("VmRSS"), "peak_rss_mb": out.get("VmHWM")}


def _du_mb(path: Path) -> float:
    return round(int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()[0]) / 1024)


class Server:
    """``python -m service`` on the bench's data directory (started, stopped, killed and started again)."""

    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a, self.work, self.port = a, work, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        """Start and wait for ``/ready``; returns the seconds it took."""
        cmd = service_command(
            self.port,
            self.a.models_dir,
            self.work / "data",
            [
                "--default-model",
                self.a.model,
                "--log-level",
                "info",
                "--max-payload-bytes",
                str(16 * 2**20),
                "--collections-max-points-per-request",
                str(self.a.batch),
                "--request-timeout-s",
                "600",
            ],
        )
        t0 = time.perf_counter()
        log = open(self.work / "server.log", "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        wait_ready(self.url, self.proc, timeout=7200, log_path=self.work / "server.log")
        return round(time.perf_counter() - t0, 1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=3600)


def ingest(srv: Server, X: np.ndarray, a: argparse.Namespace, res: dict) -> None:
    """Upsert points ``count..points-1`` with their vectors; records rate and timings in ``res["ingest"]``."""
    import httpx
    import orjson

    c = httpx.Client(base_url=srv.url, timeout=600)
    info = c.get(f"/collections/{NAME}")
    if info.status_code == 404:
        params = {"nlist": a.nlist, "nprobe": a.nprobe}
        params |= {"m": 48, "rerank": a.rerank} if a.index == "ivf_pq" else {}
        r = c.put(f"/collections/{NAME}", json={"index": a.index, "metric": "cosine", "params": params})
        r.raise_for_status()
        res["payload_keys"] = ["g", "h"]
        info = c.get(f"/collections/{NAME}")
    done = info.json()["count"]
    ing = res.setdefault("ingest", {"seconds": 0.0, "points": 0, "log": []})
    if done >= a.points:
        return
    lock, local = threading.Lock(), threading.local()
    t0, last = time.perf_counter(), [time.perf_counter(), done]

    def put(job: tuple[int, int, np.ndarray]) -> None:
        s, e, V = job
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=srv.url, timeout=600)
        pts = [{"id": i, "vector": V[i - s], "payload": {"g": i % 100, "h": i % 1000}} for i in range(s, e)]
        body = orjson.dumps({"points": pts}, option=orjson.OPT_SERIALIZE_NUMPY)
        r = local.c.put(f"/collections/{NAME}/points", content=body, headers={"content-type": "application/json"})
        r.raise_for_status()
        with lock:
            now = time.perf_counter()
            if now - last[0] > 60:
                n = e
                ing["log"].append({"points": n, "points_per_s": round((n - last[1]) / (now - last[0]))})
                print(f"ingest: {n:,} points, {(n - last[1]) / (now - last[0]):,.0f}/s, {_rss(srv.proc.pid)}",
                      flush=True)  # fmt: skip
                last[:] = [now, n]

    step = a.batch * 50  # 50 requests' points generated at once
    with ThreadPoolExecutor(a.writers) as ex:
        for s0 in range(done - done % a.batch, a.points, step):
            e0 = min(s0 + step, a.points)
            V = generate(X, s0, e0, a.seed)
            jobs = [(s, min(s + a.batch, e0), V[s - s0 : min(s + a.batch, e0) - s0]) for s in range(s0, e0, a.batch)]
            list(ex.map(put, jobs))
    ing["seconds"] += time.perf_counter() - t0
    ing["points"] += a.points - done
    ing["points_per_s"] = round(ing["points"] / ing["seconds"])


def _wait_trained(c, timeout: float = 7200) -> None:
    deadline = time.monotonic() + timeout
    while not (info := c.get(f"/collections/{NAME}").json())["trained"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not trained: {info['index']}")
        time.sleep(2)


def searches(srv: Server, Q: np.ndarray, truth: dict[str, np.ndarray], a: argparse.Namespace) -> dict:
    """Search latency at 1 and 4 clients, recall@10 unfiltered; each filter's p50/p99 and recall@10 at 1 client."""
    import httpx

    local = threading.local()

    def one(i: int, flt: dict | None = None) -> tuple[float, list]:
        if not hasattr(local, "c"):
            local.c = httpx.Client(base_url=srv.url, timeout=120)
        body = {"query": Q[i].tolist(), "top_k": K, "with_payload": False, "with_text": False}
        if a.index in ("ivf_sq", "ivf_pq_fs"):
            body["quantization"] = {"oversampling": a.oversampling}
        if flt:
            body["filter"] = flt
        t0 = time.perf_counter()
        r = local.c.post(f"/collections/{NAME}/search", json=body)
        dt = time.perf_counter() - t0
        r.raise_for_status()
        return dt, [h["id"] for h in r.json()]

    out = {}
    for clients in (1, 4):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as ex:
            lat = [dt for dt, _ in ex.map(one, range(len(Q)))]
        ms = np.asarray(lat) * 1000
        out[f"search_{clients}"] = {"queries_per_s": round(len(Q) / (time.perf_counter() - t0), 1),
                                    "p50_ms": round(float(np.percentile(ms, 50)), 1),
                                    "p99_ms": round(float(np.percentile(ms, 99)), 1)}  # fmt: skip
    got = [one(i)[1] for i in range(len(truth["all"]))]
    out["recall_at_10"] = round(float(np.mean([len(set(g) & set(t)) / K for g, t in zip(got, truth["all"])])), 4)
    for name, (flt, keep) in FILTERS.items():
        res = [one(i, flt) for i in range(min(len(truth[name]), a.filtered))]
        ms = np.asarray([dt for dt, _ in res]) * 1000
        out[f"filtered_{name}"] = {
            "filter": flt,
            "matching": int(keep(np.arange(a.points)).sum()),
            "queries": len(res),
            "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1),
            "recall_at_10": round(float(np.mean([len(set(g) & set(t)) / K for (_, g), t in zip(res, truth[name])])), 4),
            "only_matching": bool(all(keep(np.asarray(g)).all() for _, g in res if g)),
        }
    return out


def main() -> None:
    """``--mode dense`` (the default: this module) or ``--mode hybrid`` (:mod:`bench.micro.scale_hybrid`)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--mode", choices=("dense", "hybrid"), default="dense")
    m, rest = pre.parse_known_args()
    if m.mode == "hybrid":
        from bench.micro.scale_hybrid import main as hybrid

        return hybrid(rest)
    dense_main(rest)


def dense_main(argv: list[str]) -> None:
    """The 10M dense table (module docstring)."""
    ap = argparse.ArgumentParser(
        prog="python -m bench.micro.scale_bench [--mode dense]", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--mode", choices=("dense",), default="dense", help="--mode hybrid --help: the hybrid mode")
    ap.add_argument("--points", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1024, help="points per upsert request")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--index", choices=("ivf_pq", "ivf_sq", "ivf_pq_fs"), default="ivf_pq")
    ap.add_argument(
        "--oversampling",
        type=float,
        default=2.0,
        help="ivf_sq, ivf_pq_fs: candidates per hit re-scored (a search param)",
    )
    ap.add_argument("--nlist", type=int, default=4096)
    ap.add_argument("--nprobe", type=int, default=64)
    ap.add_argument("--rerank", type=int, default=10, help="ivf_pq: PQ candidates per hit re-scored exactly")
    ap.add_argument("--truth", type=int, default=200, help="queries with an exact ground truth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--filtered", type=int, default=20, help="filtered searches timed (each scans SQLite)")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--cache-dir", type=Path, default=REPO / "data" / "bench")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--fresh", action="store_true", help="delete the work directory first")
    ap.add_argument(
        "--rebuild-payload-indexes", action="store_true", help="drop g and h's indexes and build them again"
    )
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = a.work or Path.home() / ".cache" / "redundancy-embed" / "scale_bench" / str(a.points)
    if a.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    cpu = cpu_model()
    res_path = work / "results.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    res.update({"points": a.points, "cpu": cpu, "load_before": os.getloadavg(), "date": time.strftime("%Y-%m-%d")})
    print(f"load average before: {os.getloadavg()}  cpu: {cpu}  work: {work}", flush=True)

    C, _ = corpus_embeddings(a.cache_dir, None, Path(a.models_dir) / a.model)
    X, Q = C[:-1000], C[-1000:]
    tp = work / "truth.npz"
    if tp.exists() and set(np.load(tp).files) != {"all", *FILTERS}:
        tp.unlink()  # an older run's truth (one filter): made again
    if not tp.exists():
        t0 = time.perf_counter()
        np.savez(tp, **exact_truth(X, Q[: a.truth], a.points, a.seed))
        print(f"ground truth in {time.perf_counter() - t0:.0f}s", flush=True)
    t = np.load(tp)
    truth = {k: t[k] for k in t.files}

    srv = Server(a, work)
    res["start_s_first"] = srv.start()
    try:
        ingest(srv, X, a, res)
        res_path.write_text(json.dumps(res, indent=1))
        import httpx

        c = httpx.Client(base_url=srv.url, timeout=600)
        if "h" not in c.get(f"/collections/{NAME}/points/0").json().get("payload", {}):
            print(
                "warning: these points were loaded without the payload key h: the 0.1 % filter matches none (--fresh)"
            )
        _wait_trained(c)
        point0 = {"id": 0, "vector": generate(X, 0, 1, a.seed)[0].tolist(), "payload": {"g": 0, "h": 0}}
        res["payload_index_s"] = payload_indexes(c, NAME, a.rebuild_payload_indexes, point0)
        info = c.get(f"/collections/{NAME}").json()
        res["collection"] = {k: info[k] for k in ("count", "trained", "index", "sequence", "snapshot_sequence")}
        res["after_ingest"] = _rss(srv.proc.pid)
        res["search"] = searches(srv, Q, truth, a)
        print(json.dumps(res["search"]), flush=True)
        res_path.write_text(json.dumps(res, indent=1))
        srv.stop()  # clean stop: the final snapshot is written
        res["disk_mb"] = _du_mb(work / "data" / "collections" / NAME)
        res["start_s_after_clean_stop"] = srv.start()
        res["after_restart"] = _rss(srv.proc.pid)
        c = httpx.Client(base_url=srv.url, timeout=600)
        c.put(f"/collections/{NAME}/points", json={"points": [{"id": 0, "vector": generate(X, 0, 1, a.seed)[0].tolist(),
                                                                "payload": {"g": 0, "h": 0}}]})  # fmt: skip
        srv.stop(signal.SIGKILL)  # a crash right after a write: start-up replays SQLite over the last snapshot
        res["start_s_after_sigkill"] = srv.start()
        res["search_after_restart"] = searches(srv, Q[:200], truth, a)
    finally:
        srv.stop()
        res["load_after"] = os.getloadavg()
        res_path.write_text(json.dumps(res, indent=1))
    print(f"load average after: {os.getloadavg()}")
    print(json.dumps(res, indent=1))
    print(f"\n`python -m bench.micro.scale_bench {' '.join(argv)}`\n")
    print(dense_table(res, list(FILTERS)))


if __name__ == "__main__":
    main()
