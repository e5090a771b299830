"""Hostile-client benchmark (not in CI; run alone on the machine): abandoned work, fairness, deadlines, memory.

Against the real service (``python -m service`` on loopback, the default artifact):

1. **abandoned request**: a client sends ``{"input": ["word " * 300] * 500}`` (500 inputs, ~128k tokens after
   truncation) and gives up after 0.5 s; meanwhile and afterwards one-sentence requests are timed. The service
   must drop the abandoned inputs: the one-sentence latency stays under 1 s (target) instead of waiting tens of s;
2. **fairness**: the same heavy request, this time served to the end; one-sentence requests sent meanwhile are
   timed (round-robin batching: each waits for the running batch and its own, not for the heavy request);
3. **deadline**: the same heavy request with ``--request-timeout-s 2`` answers 503 ``request_timeout`` at ~2 s,
   one-sentence requests around it are timed;
4. **behind giants**: one-sentence requests while ``--big-requests`` (8) max-size requests (512 inputs of 4,000
   characters each) are in flight: tokenization and inference both fair across requests (target p99 < 1 s);
5. **memory**: the server's RSS (``/proc/<pid>/status`` VmRSS) fresh, then after 1, 2 and a hostile round: four
   concurrent 1.9 MB single-string requests, huge batches, unpaired surrogates, non-JSON bodies (target: within
   +150 MB of the fresh server);
6. **expensive queries** (:mod:`bench.faults.hostile_queries`): each expensive query kind (MMR, formula, rich
   filters, geo into arrays, order_by, distance matrix, groups, recommend, discover, context, hybrid,
   rerank-in-search) at the largest size the default limits allow, on ``--points`` points, beside a stream of
   ``/health`` and one-sentence embeddings: the heavy request's status and time, the light ones' p50 / p99 / max.

Prints a markdown table with the CPU model, the server flags and the load average before and after.

Usage::

    python -m bench.faults.hostile_bench [--threads 2] [--server-args "--max-batch-tokens 4096"]
    python -m bench.faults.hostile_bench --only-queries [--points 20000]       # the query kinds alone
    python -m bench.faults.hostile_bench --quick   # a smoke run (< 1 min): the query kinds on 500 points
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.faults import hostile_queries
from bench.lib import REPO
from bench.lib.machine import cpu_model
from bench.lib.server import run_server

HEAVY = {"input": ["word " * 300] * 500}  # --heavy-inputs changes the count
ONE = {"input": "A man is playing a guitar."}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _time_one(url: str) -> float:
    t0 = time.perf_counter()
    r = httpx.post(f"{url}/v1/embeddings", json=ONE, timeout=120)
    r.raise_for_status()
    return time.perf_counter() - t0


def _probe_while(url: str, seconds: float) -> list[float]:
    """One-sentence latencies, one request at a time, for ``seconds``."""
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(_time_one(url))
        time.sleep(0.1)
    return out


def _probe_until(url: str, done: threading.Event) -> list[float]:
    """One-sentence latencies, one request at a time, until ``done`` is set."""
    out = []
    while not done.is_set():
        out.append(_time_one(url))
        time.sleep(0.1)
    return out


def _stats(lat: list[float]) -> dict:
    return {"n": len(lat), "p50": statistics.median(lat), "max": max(lat)}


def abandoned(url: str, probe_s: float) -> dict:
    def give_up():
        try:
            httpx.post(f"{url}/v1/embeddings", json=HEAVY, timeout=httpx.Timeout(120, read=0.5))
        except httpx.ReadTimeout:
            pass

    t = threading.Thread(target=give_up)
    t.start()
    time.sleep(0.2)
    lat = _probe_while(url, probe_s)
    t.join()
    return _stats(lat)


def served(url: str) -> dict:
    """The heavy request served to the end; one-sentence latencies while it runs."""
    res, done = {}, threading.Event()

    def heavy():
        t0 = time.perf_counter()
        res["status"] = httpx.post(f"{url}/v1/embeddings", json=HEAVY, timeout=600).status_code
        res["seconds"] = time.perf_counter() - t0
        done.set()

    t = threading.Thread(target=heavy)
    t.start()
    time.sleep(0.2)
    lat = _probe_until(url, done) or [_time_one(url)]
    t.join()
    return {**res, **_stats(lat)}


def deadline(url: str, probe_s: float) -> dict:
    res = {}

    def heavy():
        t0 = time.perf_counter()
        r = httpx.post(f"{url}/v1/embeddings", json=HEAVY, timeout=120)
        res["status"], res["code"] = r.status_code, r.json().get("error", {}).get("code")
        res["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=heavy)
    t.start()
    time.sleep(0.2)
    lat = _probe_while(url, probe_s)
    t.join()
    return {**res, **_stats(lat)}


def behind_giants(url: str, n_big: int, probe_s: float) -> dict:
    """One-sentence latencies while ``n_big`` max-size requests (512 inputs of 4,000 characters: ~2 MB, 131,072
    tokens after truncation) are in flight: tokenization and inference must both be fair across requests."""
    body = {"input": [("lorem ipsum dolor sit amet, " * 143)[:4000]] * 512}  # 4,000 characters each
    stop = threading.Event()

    def big():
        while not stop.is_set():
            try:
                httpx.post(f"{url}/v1/embeddings", json=body, timeout=600)
            except httpx.HTTPError:
                return  # the server stopped at the end of the scenario

    threads = [threading.Thread(target=big, daemon=True) for _ in range(n_big)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the big requests are being tokenized
    lat = _probe_while(url, probe_s)
    stop.set()
    lat.sort()
    return {**_stats(lat), "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))]}


def hostile_round(url: str) -> None:
    big = "word " * 380_000  # ~1.9 MB, under the 2 MB body limit
    threads = [
        threading.Thread(target=lambda: httpx.post(f"{url}/v1/embeddings", json={"input": big}, timeout=120))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    raw = [b'{"input": "\\udcff"}', b'{"input": ["x", "\\ud800"]}', b"input=hello", b"{not json"]
    for body in raw:
        httpx.post(f"{url}/v1/embeddings", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    httpx.post(f"{url}/v1/embeddings", content=b"input=x", headers={"Content-Type": "text/plain"}, timeout=60)
    httpx.post(f"{url}/v1/embeddings", json={"input": ["short"] * 2048}, timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--heavy-inputs", type=int, default=500, help="inputs of ~256 tokens in the heavy request")
    ap.add_argument("--probe-seconds", type=float, default=6.0, help="how long one-sentence requests are timed")
    ap.add_argument("--big-requests", type=int, default=8, help="max-size requests in flight in the last scenario")
    ap.add_argument("--only-giants", action="store_true", help="run only the one-sentence-behind-giants scenario")
    ap.add_argument(
        "--server-args", default="", help="extra flags for python -m service, e.g. '--max-batch-tokens 4096'"
    )
    ap.add_argument("--points", type=int, default=20_000, help="points of the expensive queries' collection")
    ap.add_argument("--only-queries", action="store_true", help="run only the expensive query kinds")
    ap.add_argument("--skip-queries", action="store_true", help="leave out the expensive query kinds")
    ap.add_argument("--quick", action="store_true", help="a smoke run: the query kinds on 500 points, 200 texts")
    ap.add_argument("--reranker", default="scifact-reranker-tiny", help="reranker for rerank-in-search, if present")
    a = ap.parse_args(argv)
    HEAVY["input"] = ["word " * 300] * a.heavy_inputs
    if a.quick or a.only_queries:
        return _queries_only(a, 500 if a.quick else a.points, 200 if a.quick else 1000)
    model = cpu_model()
    load0 = os.getloadavg()
    base = ["--default-model", a.model, "--intra-op-threads", str(a.threads), "--log-level", "warning",
            *shlex.split(a.server_args)]  # fmt: skip
    if a.only_giants:
        with tempfile.TemporaryDirectory() as tmp, run_server(Path(a.models_dir), workdir=Path(tmp), args=base) as srv:
            _time_one(srv.url)
            gi = behind_giants(srv.url, a.big_requests, a.probe_seconds * 3)
        load1 = os.getloadavg()
        print(f"CPU: {model}; load average before {load0[0]:.2f}, after {load1[0]:.2f}; ORT threads {a.threads}")
        print(_giants_row(gi, a.big_requests))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        with run_server(Path(a.models_dir), workdir=Path(tmp) / "a", args=base) as srv:
            for _ in range(3):
                _time_one(srv.url)
            fresh = _rss_mb(srv.proc.pid)
            idle = statistics.median(_time_one(srv.url) for _ in range(10))
            ab = abandoned(srv.url, a.probe_seconds)
            rss_ab = _rss_mb(srv.proc.pid)
            sv = served(srv.url)
            rss_sv = _rss_mb(srv.proc.pid)
            hostile_round(srv.url)
            after = _rss_mb(srv.proc.pid)
            ok = httpx.get(f"{srv.url}/health").status_code
        with run_server(Path(a.models_dir), workdir=Path(tmp) / "b", args=[*base, "--request-timeout-s", "2"]) as srv:
            _time_one(srv.url)
            dl = deadline(srv.url, a.probe_seconds * 2 / 3)
        with run_server(Path(a.models_dir), workdir=Path(tmp) / "c", args=base) as srv:
            _time_one(srv.url)
            gi = behind_giants(srv.url, a.big_requests, a.probe_seconds * 3)
    load1 = os.getloadavg()
    print(f"CPU: {model}; load average before {load0[0]:.2f}, after {load1[0]:.2f}; ORT threads {a.threads}; "
          f"server flags {' '.join(base[2:])!r}; heavy request {a.heavy_inputs} x 256 tokens\n")  # fmt: skip
    print("| scenario | result |\n|---|---|")
    print(f"| one sentence, idle server (median of 10) | {idle * 1000:.0f} ms |")
    print(f"| one sentence while an abandoned heavy request is dropped: p50 / max over {ab['n']} | "
          f"{ab['p50'] * 1000:.0f} ms / {ab['max'] * 1000:.0f} ms (target max < 1000 ms) |")  # fmt: skip
    print(f"| heavy request served to the end | {sv.get('status')} after {sv.get('seconds', float('nan')):.2f} s |")
    print(f"| one sentence while it is served: p50 / max over {sv['n']} | {sv['p50'] * 1000:.0f} ms / "
          f"{sv['max'] * 1000:.0f} ms (target max < 1000 ms) |")  # fmt: skip
    print(f"| heavy request with request_timeout_s=2 | {dl.get('status')} {dl.get('code')} after "
          f"{dl.get('seconds', float('nan')):.2f} s |")  # fmt: skip
    print(f"| one sentence during that request: p50 / max over {dl['n']} | {dl['p50'] * 1000:.0f} ms / "
          f"{dl['max'] * 1000:.0f} ms |")  # fmt: skip
    print(f"| server RSS fresh -> after abandoned -> after served -> after the hostile round | {fresh:.0f} -> "
          f"{rss_ab:.0f} -> {rss_sv:.0f} -> {after:.0f} MB (+{after - fresh:.0f} MB; target <= +150) |")  # fmt: skip
    print(f"| /health after the hostile round | {ok} |")
    print(_giants_row(gi, a.big_requests))
    if not a.skip_queries:
        print()
        _queries_only(a, a.points, 1000)
    return 0


def _queries_only(a: argparse.Namespace, points: int, texts: int) -> int:
    """Scenario 6 on its own server: the expensive query kinds (:mod:`.hostile_queries`)."""
    models = Path(a.models_dir)
    load0 = os.getloadavg()
    args = ["--default-model", a.model, "--intra-op-threads", str(a.threads), "--log-level", "warning",
            *hostile_queries.server_args(models, a.reranker), *shlex.split(a.server_args)]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, run_server(models, workdir=Path(tmp), args=args) as srv:
        _time_one(srv.url)
        t0 = time.perf_counter()
        hostile_queries.setup(srv.url, points, texts)
        setup_s = time.perf_counter() - t0
        rows = hostile_queries.run(srv.url)
    load1 = os.getloadavg()
    print(f"CPU: {cpu_model()}; load average before {load0[0]:.2f}, after {load1[0]:.2f}; server flags "
          f"{' '.join(args[2:])!r}; {points} points, {texts} texts (setup {setup_s:.0f} s)\n")  # fmt: skip
    print(hostile_queries.table(rows))
    return 0


def _giants_row(gi: dict, n: int) -> str:
    return (f"| one sentence while {n} max-size requests (512 x 4,000 chars) are in flight: p50 / p99 / max over "
            f"{gi['n']} | {gi['p50'] * 1000:.0f} / {gi['p99'] * 1000:.0f} / {gi['max'] * 1000:.0f} ms "
            "(target p99 < 1000 ms) |")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
