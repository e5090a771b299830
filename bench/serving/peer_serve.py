"""The service against a peer embedding server on the same device, over HTTP with the same clients and texts, beside
sentence-transformers in-process: Infinity (``infinity-emb`` 0.0.78, https://github.com/michaelfeil/infinity), its
torch engine and its ONNX (``optimum``) engine. Made for a lent GPU machine (docs/gpu.md, "Infinity beside the
service"); it runs on a CPU too (the same table), which is how it was checked.

Each server runs alone on the device, one after the other: this service (``--artifact``, ``--providers``, the
``--server-arg`` flags), then Infinity with each ``--engine`` (``infinity_emb v2 --model-id <the default encoder's
sentence-transformers folder> --url-prefix /v1``, ``--peer-batch-size``, fp16 on CUDA, offline: ``HF_HUB_OFFLINE=1``,
no usage statistics). Infinity's ONNX engine needs a ``.onnx`` file in the model folder (it exports none itself):
one is exported first (``optimum``'s ONNX exporter, ``feature-extraction``, into a scratch copy of the folder), and
Infinity optimises it for the device (fp16 on CUDA) as it does for any model. The peer runs with
``PYTHONPATH=--peer-site`` (``kit.sh install``'s ``/tmp/peer-infinity``: its pinned numpy<2, sentence-transformers<4
and transformers<5 stay out of the service's path) and the CUDA libraries of the machine's ``nvidia`` packages on
``LD_LIBRARY_PATH`` (its ONNX engine does not preload them as the service does).

Per server: its vectors of 256 STS-B sentences against sentence-transformers fp32 in-process (min cosine, a column
of the table: a server whose vectors differ is measured but shows it there), then per input kind ``--warmup``
seconds of unrecorded traffic at the most clients, then every ``--clients`` point ``--repeats`` times (closed loop for ``--seconds``: the clients of
``bench/serving/gpu_serve.py``, ``POST /v1/embeddings`` with ``--batch`` inputs, base64 answers decoded). The table
gives the median and the min-max over the repeats; sentence-transformers ``--st-dtype`` in-process at batch
``--batch`` and 256 likewise (``--repeats`` timed encodes after a warm-up); the ratio column is each server's median
tokens/s over Infinity's torch engine's at the same point.

Usage (on the device, after ``bench/device/kit.sh install`` of a ``kit.py --with infinity`` kit)::

    python -m bench.serving.peer_serve --providers cuda --json $OUT/peer_serve.json
    python -m bench.serving.peer_serve --providers cpu --device cpu --st-device cpu --st-dtype fp32 --artifact \\
        all-minilm-l6-v2 --peer-site /tmp/infvenv/lib/python3.11/site-packages --clients 4 --inputs stsb --seconds 2

Not a test: it asserts nothing, it prints a table (and ``--json`` writes the numbers).
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.machine import Dmon, cpu_model
from bench.lib.server import run_server
from bench.serving.gpu_serve import _client_proc, count_tokens, inputs
from bench.serving.infinity_peer import infinity, onnx_copy


def point(url: str, texts: list[str], toks: np.ndarray, batch: int, clients: int, procs: int, seconds: float) -> dict:
    """One closed-loop point against ``url``: ``clients`` threads over ``procs`` processes for ``seconds``."""
    reqs = [texts[i : i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    rtoks = [int(toks[i : i + batch].sum()) for i in range(0, len(texts) - batch + 1, batch)]
    procs = max(1, min(procs, clients))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    start = time.time() + 2.0  # every process started and connected
    stop = start + seconds
    per = [clients // procs + (k < clients % procs) for k in range(procs)]
    ps = [
        ctx.Process(target=_client_proc, args=([url], sum(per[:k]), reqs, rtoks, per[k], start, stop, q))
        for k in range(procs)
    ]
    for p in ps:
        p.start()
    time.sleep(max(0.0, start - time.time()))
    dmon = Dmon()
    results = [q.get() for _ in ps]
    util = dmon.stop()
    for p in ps:
        p.join()
    rows = [r for rs, _ in results for r in rs]
    errors = [e for _, es in results for e in es]
    lat = np.array([r[0] for r in rows]) * 1000 if rows else np.array([np.nan])
    return {
        "sent_per_s": sum(r[1] for r in rows) / seconds,
        "tok_per_s": sum(r[2] for r in rows) / seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "gpu_util": util,
    }


def embed(url: str, texts: list[str]) -> np.ndarray:
    """``texts`` embedded by the server at ``url`` (``POST /v1/embeddings``, base64), shape ``(len(texts), dim)``."""
    import httpx

    out = []
    for i in range(0, len(texts), 32):
        r = httpx.post(
            f"{url}/v1/embeddings", json={"input": texts[i : i + 32], "encoding_format": "base64"}, timeout=120
        )
        r.raise_for_status()
        out += [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in r.json()["data"]]
    return np.stack(out)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The smallest row-wise cosine between ``a`` and ``b`` (same shape)."""
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


def spread(xs: list[float]) -> dict:
    """Median, min and max of ``xs``."""
    return {"median": float(np.median(xs)), "min": float(min(xs)), "max": float(max(xs))}


def bench_st(model, texts: list[str], toks: np.ndarray, batch_sizes: list[int], repeats: int) -> list[dict]:
    """sentence-transformers in-process: ``repeats`` timed encodes of ``texts`` per batch size after a warm-up."""
    import torch

    cuda = str(model.device).startswith("cuda")
    out = []
    for bs in batch_sizes:
        model.encode(texts[: 4 * bs], batch_size=bs)
        rates = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.encode(texts, batch_size=bs)
            if cuda:
                torch.cuda.synchronize()
            rates.append(time.perf_counter() - t0)
        out.append(
            {
                "batch_size": bs,
                "sent_per_s": spread([len(texts) / s for s in rates]),
                "tok_per_s": spread([float(toks.sum()) / s for s in rates]),
            }
        )
    return out


def measure(url: str, name: str, data: dict, toks: dict, ref: dict, a) -> list[dict]:
    """Every point of the server at ``url`` (vectors checked against ``ref`` first), ``a.repeats`` times each."""
    cos = min_cosine(embed(url, ref["texts"]), ref["vectors"])
    print(
        f"{name}: min cosine to sentence-transformers fp32 over {len(ref['texts'])} STS-B sentences {cos:.5f}",
        flush=True,
    )
    rows = []
    for k, texts in data.items():
        if a.warmup > 0:
            point(url, texts, toks[k], a.batch, max(a.clients), a.client_procs, a.warmup)
        for n in a.clients:
            reps = [point(url, texts, toks[k], a.batch, n, a.client_procs, a.seconds) for _ in range(a.repeats)]
            row = {
                "server": name,
                "inputs": k,
                "clients": n,
                "min_cosine": cos,
                "runs": reps,
                "errors": sum(r["errors"] for r in reps),
                "first_error": next((r["first_error"] for r in reps if r["first_error"]), None),
                "gpu_util": spread([r["gpu_util"] or 0.0 for r in reps]),
            }
            for key in ("sent_per_s", "tok_per_s", "p50_ms", "p99_ms"):
                row[key] = spread([r[key] for r in reps])
            rows.append(row)
            s = row["sent_per_s"]
            print(
                f"  {name} {k} x{n}: {s['median']:.0f} sent/s ({s['min']:.0f}-{s['max']:.0f}), "
                f"p50 {row['p50_ms']['median']:.1f} ms, errors {row['errors']}",
                flush=True,
            )
    return rows


def table(results: dict, a) -> None:
    """The markdown tables: every server's points (median and min-max over the repeats), then the baseline."""
    ours = {
        (r["inputs"], r["clients"]): r["tok_per_s"]["median"]
        for r in results["servers"]
        if r["server"] == "infinity-torch"
    }
    print(f"\n{a.batch} inputs per request, {a.seconds:.0f} s per point, {a.repeats} repeats (median, min-max)")
    print(
        "| server | inputs | clients | sentences/s | tokens/s | p50 ms | p99 ms | errors | GPU SM % "
        "| tokens/s / Infinity torch | min cosine |"
    )
    print("|" + "---|" * 11)
    for r in results["servers"]:
        s, t = r["sent_per_s"], r["tok_per_s"]
        base = ours.get((r["inputs"], r["clients"]))
        ratio = f"{t['median'] / base:.2f}x" if base else "-"
        util = f"{r['gpu_util']['median']:.0f}" if r["gpu_util"]["max"] else "-"
        print(
            f"| {r['server']} | {r['inputs']} | {r['clients']} | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) "
            f"| {t['median']:,.0f} ({t['min']:,.0f}-{t['max']:,.0f}) | {r['p50_ms']['median']:.1f} "
            f"| {r['p99_ms']['median']:.1f} | {r['errors']} | {util} | {ratio} | {r['min_cosine']:.4f} |"
        )
    for name, msg in results["failed"].items():
        print(f"| {name} | - | - | failed: {msg[:200]!r} |")
    if results["st"]:
        print(f"\nsentence-transformers in-process, {a.st_device} {a.st_dtype} ({a.repeats} encodes, median, min-max):")
        print("| inputs | batch size | sentences/s | tokens/s |")
        print("|---|---|---|---|")
        for k, rows in results["st"].items():
            for r in rows:
                s, t = r["sent_per_s"], r["tok_per_s"]
                print(
                    f"| {k} | {r['batch_size']} | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) "
                    f"| {t['median']:,.0f} ({t['min']:,.0f}-{t['max']:,.0f}) |"
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--artifact", default="all-minilm-l6-v2-fp16")
    ap.add_argument("--providers", default="auto", help="the service's --providers")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra service flag (repeatable)")
    ap.add_argument("--skip-service", action="store_true")
    ap.add_argument("--engine", action="append", choices=["torch", "optimum"], help="Infinity's engines (default both)")
    ap.add_argument("--device", default="cuda", help="Infinity's --device (cuda, cpu)")
    ap.add_argument("--peer-batch-size", type=int, default=256, help="Infinity's --batch-size (its largest batch)")
    ap.add_argument("--peer-site", default="/tmp/peer-infinity", help="Infinity's packages (kit.sh install)")
    ap.add_argument(
        "--peer-python", default=sys.executable, help="the interpreter Infinity runs in (default: this one)"
    )
    ap.add_argument("--clients", default="32,128")
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--batch", type=int, default=32, help="inputs per request")
    ap.add_argument("--inputs", default="stsb,128")
    ap.add_argument("--seconds", type=float, default=4.0, help="per point and repeat")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every point (the table: median, min-max)")
    ap.add_argument(
        "--warmup",
        type=float,
        default=3.0,
        help="seconds of unrecorded traffic per server and input kind first, at the most clients",
    )
    ap.add_argument("--pool", type=int, default=4096, help="distinct inputs per kind")
    ap.add_argument("--st-device", default="cuda")
    ap.add_argument("--st-dtype", choices=["fp16", "fp32"], default="fp16")
    ap.add_argument("--skip-st", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    a.clients = [int(c) for c in a.clients.split(",")]
    engines = a.engine or ["torch", "optimum"]

    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from training.st_dir import default_model_dir

    art = Path(a.models_dir) / a.artifact
    max_len = int(json.loads((art / "manifest.json").read_text()).get("max_seq_length", 256))
    tok = Tokenizer.from_file(str(art / "tokenizer.json"))
    gpu = (
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip()
        if shutil.which("nvidia-smi")
        else "none"
    )
    load0 = os.getloadavg()[0]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; GPU: {gpu}; load average {load0:.2f}")
    data = {k: inputs(k, tok, max_len, a.pool) for k in a.inputs.split(",")}
    toks = {k: count_tokens(tok, v, max_len) for k, v in data.items()}
    model_dir = default_model_dir()
    ref_texts = data.get("stsb", next(iter(data.values())))[:256]
    ref = {"texts": ref_texts, "vectors": SentenceTransformer(str(model_dir), device="cpu").encode(ref_texts)}
    results: dict = {"servers": [], "failed": {}, "st": {}, "args": vars(a), "gpu": gpu, "load_before": load0}
    work = Path(tempfile.mkdtemp(prefix="peer-serve-"))

    def dump() -> None:  # after every server: a stage stopped at its time limit keeps what it measured
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1))

    if not a.skip_service:
        args = ["--default-model", a.artifact, "--providers", a.providers, "--log-level", "warning", *a.server_arg]
        with run_server(Path(a.models_dir), workdir=work / "service", args=args) as srv:
            results["servers"] += measure(srv.url, "service", data, toks, ref, a)
        dump()
    for engine in engines:
        name = f"infinity-{engine}"
        try:
            t0 = time.time()
            folder, dtype = (
                onnx_copy(model_dir, a.peer_site, a.peer_python, a.device, work)
                if engine == "optimum"
                else (model_dir, "")
            )
            name += f"-{dtype}" if dtype else ""
            with infinity(
                folder, engine, a.device, a.peer_batch_size, a.peer_site, a.peer_python, work / f"{name}.log"
            ) as url:
                print(f"{name}: up in {time.time() - t0:.0f} s{' (ONNX export included)' if dtype else ''}", flush=True)
                results["servers"] += measure(url, name, data, toks, ref, a)
        except (RuntimeError, subprocess.CalledProcessError) as e:
            msg = str(e) + (e.stderr[-1500:] if isinstance(e, subprocess.CalledProcessError) else "")
            results["failed"][name] = msg
            print(f"{name}: FAILED {msg}", flush=True)
        dump()
    if not a.skip_st:
        st = SentenceTransformer(str(model_dir), device=a.st_device)
        st = st.half() if a.st_dtype == "fp16" else st
        for k in data:
            results["st"][k] = bench_st(st, data[k], toks[k], sorted({a.batch, 256}), a.repeats)
    results["load_after"] = os.getloadavg()[0]
    table(results, a)
    print(f"\nload average before {load0:.2f}, after {results['load_after']:.2f}")
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
