"""Soak benchmark (not in CI; run alone on the machine): mixed traffic for N minutes against the real service.

``--clients`` closed-loop clients (each waits ``--think-ms`` between requests) send real STS-B sentences to
``/v1/embeddings``, ``/embed``, ``/similarity`` and to two collections (flat and hnsw): upserts, searches by text
(with and without a payload filter), batch searches, searches by vector, point reads, deletes by id and by filter.
Each client owns its own id range, so it knows exactly which of its points exist.

Prints three tables:

* per minute: requests, requests/s, p50/p99 latency (all operations), errors (non-2xx or transport errors), the
  server's RSS at the end of the minute and its maximum (``/proc/<pid>/status`` VmRSS, sampled every second);
* per operation: count, p50/p99, errors;
* reconciliation: ``/metrics`` counters (deltas over the run) against what the clients sent —
  ``embed_requests_total`` per route/method/status, ``embed_inputs_total`` against the inputs the requests embed
  (embedding inputs, distinct similarity texts, upserted texts, text queries), and each collection's ``count``
  against the points the clients hold. A mismatch is marked ``MISMATCH``.

Usage::

    python -m bench.serving.soak_bench --minutes 30 --clients 4
    python -m bench.serving.soak_bench --minutes 1 --clients 2   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.lib import REPO
from bench.lib.machine import cpu_model
from bench.lib.server import run_server
from training.data.sts import load_task

COLLECTIONS = {"soak_flat": {"index": "flat", "metric": "cosine"}, "soak_hnsw": {"index": "hnsw", "metric": "cosine"}}
ID_SPACE = 400  # ids per client and collection: the collections stay bounded
BUCKETS = 8  # payload buckets per client (deletes by filter remove one bucket)


@dataclass
class Record:
    """One request: when it ended (s since the start), its operation, route template, method, status, latency."""

    t: float
    op: str
    route: str
    method: str
    status: int | str  # HTTP status, or the transport error's class name
    seconds: float


@dataclass
class Client:
    """One closed-loop client: its sentences, its points per collection (id -> bucket), its expected inputs."""

    k: int
    url: str
    sentences: list[str]
    rng: random.Random
    points: dict[str, dict[int, int]] = field(default_factory=lambda: {c: {} for c in COLLECTIONS})
    inputs: int = 0  # inputs the server embeds for this client's successful requests

    def texts(self, n: int) -> list[str]:
        return self.rng.sample(self.sentences, n)

    def send(self, http: httpx.Client, op: str, method: str, route: str, path: str, body=None) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            r = http.request(method, path, json=body)
            status: int | str = r.status_code
        except httpx.HTTPError as e:
            r, status = None, type(e).__name__
        t1 = time.perf_counter()
        RECORDS.append(Record(t1 - START[0], op, route, method, status, t1 - t0))
        return r if r is not None and r.status_code == 200 else None

    def step(self, http: httpx.Client) -> None:
        """One request, drawn from the mix."""
        rng = self.rng
        col = rng.choice(list(COLLECTIONS))
        base = self.k * 10**6
        mine = self.points[col]
        x = rng.random()
        if x < 0.25:
            texts = self.texts(rng.randint(1, 32))
            if self.send(http, "embeddings", "POST", "/v1/embeddings", "/v1/embeddings", {"input": texts}):
                self.inputs += len(texts)
        elif x < 0.33:
            texts = self.texts(rng.randint(1, 16))
            if self.send(http, "embed", "POST", "/embed", "/embed", {"inputs": texts}):
                self.inputs += len(texts)
        elif x < 0.41:
            texts = self.texts(rng.randint(2, 12))
            body = {"source_sentence": texts[0], "sentences": texts[1:]}
            if self.send(http, "similarity", "POST", "/similarity", "/similarity", body):
                self.inputs += len(set(texts))
        elif x < 0.61:
            n = rng.randint(1, 16)
            ids = rng.sample(range(ID_SPACE), n)
            texts = self.texts(n)
            buckets = [rng.randrange(BUCKETS) for _ in ids]
            pts = [{"id": base + i, "text": t, "payload": {"client": self.k, "bucket": b}}
                   for i, t, b in zip(ids, texts, buckets)]  # fmt: skip
            if self.send(http, "upsert", "PUT", "/collections/{name}/points", f"/collections/{col}/points",
                         {"points": pts}):  # fmt: skip
                mine.update(zip(ids, buckets))
                self.inputs += n
        elif x < 0.76:
            body = {"query": self.texts(1)[0], "top_k": 10, "with_payload": True}
            if rng.random() < 0.5:
                body["filter"] = {"client": self.k}
            if self.send(http, "search", "POST", "/collections/{name}/search", f"/collections/{col}/search", body):
                self.inputs += 1
        elif x < 0.81:
            qs = [{"query": t, "top_k": 5} for t in self.texts(rng.randint(2, 8))]
            path = f"/collections/{col}/search/batch"
            if self.send(http, "search_batch", "POST", "/collections/{name}/search/batch", path, {"searches": qs}):
                self.inputs += len(qs)
        elif x < 0.84:
            v = [rng.gauss(0, 1) for _ in range(384)]
            self.send(http, "search_vector", "POST", "/collections/{name}/search", f"/collections/{col}/search",
                      {"query": v, "top_k": 10})  # fmt: skip
        elif x < 0.90 and mine:
            pid = rng.choice(list(mine))
            self.send(http, "get_point", "GET", "/collections/{name}/points/{point_id:path}",
                      f"/collections/{col}/points/{base + pid}")  # fmt: skip
        elif x < 0.97 and mine:
            ids = rng.sample(list(mine), min(len(mine), rng.randint(1, 8)))
            path = f"/collections/{col}/points/delete"
            if self.send(http, "delete_ids", "POST", "/collections/{name}/points/delete", path,
                         {"ids": [base + i for i in ids]}):  # fmt: skip
                for i in ids:
                    mine.pop(i, None)
        elif mine:
            b = rng.randrange(BUCKETS)
            path = f"/collections/{col}/points/delete"
            if self.send(http, "delete_filter", "POST", "/collections/{name}/points/delete", path,
                         {"filter": {"client": self.k, "bucket": b}}):  # fmt: skip
                for i in [i for i, bb in mine.items() if bb == b]:
                    del mine[i]

    def run(self, until: float, think_s: float) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as http:
            while time.perf_counter() < until:
                self.step(http)
                if think_s:
                    time.sleep(think_s)


RECORDS: list[Record] = []
START = [0.0]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _counters(url: str) -> dict[tuple[str, tuple], float]:
    """Every counter sample of ``/metrics``: (sample name, sorted labels) -> value."""
    out = {}
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if fam.type == "counter":
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) * 1000 if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--think-ms", type=float, default=20.0, help="pause of each client between two requests")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--server-args", default="", help="extra flags for python -m service")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    s = load_task("STSBenchmark")
    sentences = list(dict.fromkeys(s.sent1 + s.sent2))
    model = cpu_model()
    flags = ["--default-model", a.model, "--intra-op-threads", str(a.threads), "--log-level", "warning",
             *shlex.split(a.server_args)]  # fmt: skip
    load0 = os.getloadavg()
    rss: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(a.models_dir), workdir=Path(tmp), args=flags) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            for name, spec in COLLECTIONS.items():
                http.put(f"/collections/{name}", json=spec).raise_for_status()
        before = _counters(srv.url)
        fresh = _rss_mb(srv.proc.pid)
        clients = [Client(k, srv.url, sentences, random.Random(a.seed * 1000 + k)) for k in range(a.clients)]
        START[0] = time.perf_counter()
        until = START[0] + 60 * a.minutes
        threads = [threading.Thread(target=c.run, args=(until, a.think_ms / 1000)) for c in clients]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss.append((time.perf_counter() - START[0], _rss_mb(srv.proc.pid)))
            time.sleep(1.0)
        for t in threads:
            t.join()
        after = _counters(srv.url)
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            counts = {name: http.get(f"/collections/{name}").json()["count"] for name in COLLECTIONS}
        end_rss = _rss_mb(srv.proc.pid)
        alive = srv.alive()
    load1 = os.getloadavg()

    print(f"CPU: {model}; load average before {load0[0]:.2f}, after {load1[0]:.2f}; server flags {' '.join(flags)!r}; "
          f"{a.clients} clients, think {a.think_ms:g} ms, {a.minutes:g} min, seed {a.seed}\n")  # fmt: skip
    ok = lambda r: isinstance(r.status, int) and 200 <= r.status < 300  # noqa: E731
    print("| minute | requests | req/s | p50 ms | p99 ms | errors | RSS end / max MB |\n|---|---|---|---|---|---|---|")
    minutes = int(np.ceil(a.minutes))
    for m in range(minutes):
        recs = [r for r in RECORDS if m * 60 <= r.t < (m + 1) * 60]
        lat = [r.seconds for r in recs]
        samples = [v for t, v in rss if m * 60 <= t < (m + 1) * 60] or [float("nan")]
        span = min(60.0, 60 * a.minutes - m * 60)
        print(f"| {m + 1} | {len(recs)} | {len(recs) / span:.1f} | {_pct(lat, 50):.0f} | {_pct(lat, 99):.0f} | "
              f"{sum(not ok(r) for r in recs)} | {samples[-1]:.0f} / {max(samples):.0f} |")  # fmt: skip
    print(
        f"\nRSS: fresh {fresh:.0f} MB, end {end_rss:.0f} MB (+{end_rss - fresh:.0f}); server alive at the end: {alive}"
    )
    print("\n| operation | n | p50 ms | p99 ms | errors |\n|---|---|---|---|---|")
    by_op = defaultdict(list)
    for r in RECORDS:
        by_op[r.op].append(r)
    for op, recs in sorted(by_op.items()):
        lat = [r.seconds for r in recs]
        errs = Counter(r.status for r in recs if not ok(r))
        print(f"| {op} | {len(recs)} | {_pct(lat, 50):.0f} | {_pct(lat, 99):.0f} | {dict(errs) or 0} |")

    print("\n| reconciliation | sent / held by clients | /metrics or the service | |\n|---|---|---|---|")
    sent = Counter((r.route, r.method, str(r.status)) for r in RECORDS if isinstance(r.status, int))
    delta = Counter()
    for (name, labels), v in after.items():
        if name == "embed_requests_total":
            lab = dict(labels)
            if lab["route"] != "/metrics" and not (lab["route"] == "/collections/{name}" and lab["method"] == "GET"):
                delta[(lab["route"], lab["method"], lab["status"])] += v - before.get((name, labels), 0.0)
    for key in sorted(set(sent) | {k for k, v in delta.items() if v}):
        mark = "" if sent[key] == delta[key] else "MISMATCH"
        print(f"| embed_requests_total {key[1]} {key[0]} {key[2]} | {sent[key]} | {delta[key]:.0f} | {mark} |")
    inputs = sum(v - before.get(k, 0.0) for k, v in after.items() if k[0] == "embed_inputs_total")
    expected = sum(c.inputs for c in clients)
    print(f"| embed_inputs_total | {expected} | {inputs:.0f} | {'' if expected == inputs else 'MISMATCH'} |")
    for name in COLLECTIONS:
        held = sum(len(c.points[name]) for c in clients)
        print(f"| {name} count | {held} | {counts[name]} | {'' if held == counts[name] else 'MISMATCH'} |")
    transport = Counter(r.status for r in RECORDS if isinstance(r.status, str))
    print(f"| transport errors (no HTTP status) | {dict(transport) or 0} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
