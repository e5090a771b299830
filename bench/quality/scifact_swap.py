"""The user's flow on a retrieval task: a running service holds BEIR SciFact embedded by the default encoder; a
fine-tuned encoder is published into its models directory; the service activates it by itself, re-embeds the
collection under load, and search gets better — measured through the HTTP API and against the offline number.

Setup (a temporary directory): ``minilm/1`` = the default fp32 artifact; the service runs with ``--model-control
poll`` and ``--default-model minilm``; a flat cosine collection holds SciFact's 5,183 abstracts (``title text``,
the document id in the payload), embedded by ``minilm:1`` through ``PUT /collections/scifact/points``.

1. ``before``: nDCG@10 / Recall@100 of the 300 test claims searched through ``POST /collections/scifact/search``
   (top 100), BEIR's protocol;
2. ``--clients`` closed-loop clients start (each alternates ``POST /v1/embeddings`` of 8 claims and a search);
3. publish: ``python -m training export --model MODEL`` into a staging folder, renamed into ``models/minilm/2`` in
   whole (what ``train --publish`` does); the service's poll activates it (load, warm-up, canary, swap) and the
   collection re-embeds every point in the background;
4. ``after``: the same searches once the collection reports its re-embedding ``completed``; the load stops;
5. ``offline``: the same artifact (``minilm/2``) evaluated without the service: ONNX Runtime in-process
   (:func:`training.evaluation.onnx_encode_fn`) over the same corpus and claims, exact cosine search
   (:func:`training.retrieval.evaluate_retrieval`). Served = offline within 0.1 is the check.

Reported: the three numbers, the activation and re-embedding times, the requests of each kind and the failed ones.

    python -m bench.quality.scifact_swap --model /work/runs/scifact_ft/best --json /work/runs/scifact_swap.json

Run it alone (it indexes and re-embeds 5,183 abstracts on the CPU); it prints the CPU and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.lib import REPO
from bench.lib.artifacts import NAME, default_artifact, versioned_copy
from bench.lib.machine import cpu_model
from bench.lib.scifact import data_args, load, run_native, score
from bench.lib.server import run_server

BATCH = 64


class Load:
    """Closed-loop clients, each alternating an embeddings request of 8 claims and a search of one; records
    ``(kind, ok)`` per request."""

    def __init__(self, url: str, claims: list[str], clients: int) -> None:
        self.url, self.claims = url, claims
        self.stop = threading.Event()
        self.records: list[tuple[str, bool, int]] = []
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, seed: int) -> None:
        k = seed * 31
        with httpx.Client(base_url=self.url, timeout=120.0) as c:
            while not self.stop.is_set():
                k += 8
                for kind in ("embed", "search"):
                    try:
                        if kind == "embed":
                            r = c.post("/v1/embeddings", json={"input": [self.claims[(k + j) % len(self.claims)]
                                                                          for j in range(8)]})  # fmt: skip
                        else:
                            body = {"query": self.claims[k % len(self.claims)], "top_k": 10}
                            r = c.post("/collections/scifact/search", json=body)
                        self.records.append((kind, r.status_code == 200, r.status_code))
                    except httpx.HTTPError:
                        self.records.append((kind, False, 0))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=120)


def served(c: httpx.Client, queries: dict[str, str], qrels: dict) -> tuple[float, float]:
    """nDCG@10 and Recall@100 (x100) of the test claims searched through the service (top 100)."""
    return score(run_native(c, queries, {})[0], qrels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_args(ap)
    ap.add_argument("--model", required=True, help="the fine-tuned sentence-transformers directory to publish")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--max-docs", type=int, help="index only the first N abstracts (a smoke run: not BEIR's numbers)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    corpus, queries, qrels = load(Path(a.data))
    if a.max_docs:
        corpus = corpus[: a.max_docs]
    print(f"CPU: {cpu_model()}; load average before: {os.getloadavg()}", flush=True)
    out: dict = {"model": a.model, "cpu": cpu_model(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="scifact_swap-") as tmp:
        root = Path(tmp)
        models = root / "models"
        versioned_copy(default_artifact(), models, NAME, "1")
        args = ["--default-model", NAME, "--model-control", "poll", "--model-poll-interval-s", "1", "--log-level",
                "warning"]  # fmt: skip
        with run_server(models, workdir=root / "work", args=args) as srv, httpx.Client(base_url=srv.url,
                                                                                        timeout=600) as c:  # fmt: skip
            c.put("/collections/scifact", json={"index": "flat", "metric": "cosine"}).raise_for_status()
            t0 = time.monotonic()
            for i in range(0, len(corpus), BATCH):
                pts = [{"id": j, "text": f"{d['title']} {d['text']}", "payload": {"doc": d["_id"]}}
                       for j, d in enumerate(corpus[i : i + BATCH], start=i)]  # fmt: skip
                c.put("/collections/scifact/points", json={"points": pts}).raise_for_status()
            out["index_seconds"] = round(time.monotonic() - t0, 1)
            out["before"] = served(c, queries, qrels)
            print(
                f"indexed {len(corpus)} in {out['index_seconds']} s; before: nDCG@10 {out['before'][0]:.2f}", flush=True
            )
            with Load(srv.url, list(queries.values()), a.clients) as traffic:
                time.sleep(2.0)
                stage = root / "stage"
                cmd = [sys.executable, "-m", "training", "export", "--model", a.model, "--output",
                       str(stage / NAME / "2"), "--name", NAME, "--version", "2"]  # fmt: skip
                t_pub = time.monotonic()
                subprocess.run(cmd, cwd=REPO, check=True, capture_output=True)
                (models / NAME).mkdir(exist_ok=True)
                os.rename(stage / NAME / "2", models / NAME / "2")  # published in whole
                t_ready = time.monotonic()
                while c.get("/info").json()["model_version"] != "2":
                    time.sleep(0.1)
                t_active = time.monotonic()
                while (
                    (st := c.get("/collections/scifact").json().get("reembedding") or {}).get("state")
                    not in ("completed", "failed", "cancelled")
                ) or st.get("target_model", {}).get("version") != "2":
                    time.sleep(0.5)  # fmt: skip
                t_done = time.monotonic()
                out["after"] = served(c, queries, qrels)
            out.update(export_seconds=round(t_ready - t_pub, 1), activation_seconds=round(t_active - t_ready, 1),
                       reembedding=st, reembedding_wall_seconds=round(t_done - t_active, 1))  # fmt: skip
            recs = traffic.records
            out["requests"] = {k: sum(1 for r in recs if r[0] == k) for k in ("embed", "search")}
            out["failed"] = [r for r in recs if not r[1]]
            from training.data.scifact import load_scifact
            from training.evaluation import onnx_encode_fn
            from training.retrieval import evaluate_retrieval

            t0 = time.monotonic()
            test = load_scifact(split="test", directory=a.data)
            if a.max_docs:  # the same documents as the collection
                keep = {d["_id"] for d in corpus}
                test.corpus = {d: t for d, t in test.corpus.items() if d in keep}
            off = evaluate_retrieval(onnx_encode_fn(str(models / NAME / "2")), test)
            out["offline"] = [off["ndcg@10"], off["recall@100"]]
            out["offline_seconds"] = round(time.monotonic() - t0, 1)
    out["load_after"] = os.getloadavg()
    out["served_minus_offline"] = out["after"][0] - out["offline"][0]
    print(json.dumps(out, indent=1, default=str))
    print("\n| stage | nDCG@10 | Recall@100 |\n|---|---:|---:|")
    for k in ("before", "after", "offline"):
        print(f"| {k} | {out[k][0]:.2f} | {out[k][1]:.2f} |")
    print(f"served - offline: {out['served_minus_offline']:+.3f}; failed requests: {len(out['failed'])} of "
          f"{sum(out['requests'].values())}")  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
