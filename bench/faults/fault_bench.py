"""Fault benchmark (not in CI; run alone on the machine): two service replicas on one real Milvus server, with
writers, readers and probes on both, while Milvus is SIGKILLed and restarted on the same data, then a replica is
SIGKILLed and restarted.

Timeline: ``--warm-s`` of normal traffic; Milvus killed; ``--down-s`` without it; Milvus restarted (the time it
answers again is noted); traffic until every operation has answered 200 for 3 s in a row (or ``--recover-max-s``);
replica B killed and restarted; ``--tail-s`` more.

Reports, per second: status counts of collection requests and the worst ``/health`` and one-sentence embedding
latency; then acknowledged / lost / extra points (every acknowledged upsert must be in Milvus at the end; "extra":
applied although its request answered 503, which the API allows and says), 500s, the worst collection request
against its bound (``collections_milvus_write_timeout_s`` + 1 s), and the time from Milvus answering again to
normal service. Goals: 0 lost, ``/health`` < 100 ms throughout, no 500, nothing past its bound, normal service
<= 15 s after Milvus answers.

Usage::

    python -m bench.faults.fault_bench                      # about 2 minutes
    python -m bench.faults.fault_bench --down-s 30 --writers 2
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.lib import REPO
from bench.lib.machine import cpu_model
from bench.lib.server import free_port, run_server, service_command, wait_ready
from harness.milvus import milvus_client, milvus_server

T0 = time.monotonic()


class Log:
    """Every request: (second since start, replica, operation, status, latency s)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, str, str, int, float]] = []
        self.lock = threading.Lock()

    def add(self, replica: str, op: str, status: int, dt: float) -> None:
        with self.lock:
            self.rows.append((int(time.monotonic() - T0), replica, op, status, dt))


def _call(c: httpx.Client, log: Log, replica: str, op: str, fn) -> httpx.Response | None:
    t0 = time.perf_counter()
    try:
        r = fn(c)
        status = r.status_code
    except httpx.HTTPError:
        r, status = None, 0  # connection refused: the replica is down
    log.add(replica, op, status, time.perf_counter() - t0)
    return r


def writer(url: str, replica: str, wid: int, log: Log, acked: set, stop: threading.Event) -> None:
    n = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            ids = [f"{replica}{wid}-{n + i}" for i in range(8)]
            body = {"points": [{"id": i, "text": f"point {i} written during the fault run"} for i in ids]}
            r = _call(c, log, replica, "upsert", lambda c, b=body: c.put("/collections/fault/points", json=b))
            if r is not None and r.status_code == 200:
                acked.update(ids)
            if r is None:
                time.sleep(0.2)
            n += 8


def reader(url: str, replica: str, log: Log, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            r = _call(c, log, replica, "search",
                      lambda c: c.post("/collections/fault/search", json={"query": "written point", "top_k": 5}))  # fmt: skip
            _call(c, log, replica, "info", lambda c: c.get("/collections/fault"))
            if r is None:
                time.sleep(0.2)


def prober(url: str, replica: str, log: Log, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        while not stop.is_set():
            r = _call(c, log, replica, "health", lambda c: c.get("/health"))
            _call(c, log, replica, "embed", lambda c: c.post("/v1/embeddings", json={"input": "A man plays a guitar."}))
            time.sleep(0.05 if r is not None else 0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--warm-s", type=float, default=10)
    ap.add_argument("--down-s", type=float, default=20)
    ap.add_argument("--recover-max-s", type=float, default=60)
    ap.add_argument("--tail-s", type=float, default=10)
    ap.add_argument("--writers", type=int, default=1, help="writers per replica")
    a = ap.parse_args(argv)
    model = cpu_model()
    load0 = os.getloadavg()
    log, acked, stop = Log(), set(), threading.Event()
    marks: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, milvus_server(Path(tmp) / "milvus") as m:
        os.environ["EMBED_COLLECTIONS_MILVUS_TOKEN"] = m.token
        args = ["--default-model", a.model, "--collections-backend", "milvus", "--collections-milvus-uri", m.uri,
                "--collections-milvus-prefix", "fault_", "--log-level", "warning"]  # fmt: skip
        port_b = free_port()
        with (
            run_server(Path(a.models_dir), workdir=Path(tmp) / "a", args=args) as sa,
            run_server(Path(a.models_dir), workdir=Path(tmp) / "b", args=args, port=port_b) as sb,
        ):
            assert httpx.put(f"{sa.url}/collections/fault", json={}, timeout=120).status_code == 200
            workers = []
            for url, rep in ((sa.url, "A"), (sb.url, "B")):
                workers += [
                    threading.Thread(target=writer, args=(url, rep, w, log, acked, stop)) for w in range(a.writers)
                ]
                workers += [threading.Thread(target=reader, args=(url, rep, log, stop)),
                            threading.Thread(target=prober, args=(url, rep, log, stop))]  # fmt: skip
            for w in workers:
                w.start()
            time.sleep(a.warm_s)
            marks["milvus killed"] = time.monotonic() - T0
            m.kill()
            time.sleep(a.down_s)
            m.start()
            marks["milvus answers"] = up = time.monotonic() - T0
            normal_since = None
            while time.monotonic() - T0 < up + a.recover_max_s:
                time.sleep(0.5)
                now = int(time.monotonic() - T0)
                recent = [r for r in log.rows if r[0] >= now - 3 and r[2] in ("upsert", "search", "info")]
                if recent and all(r[3] == 200 for r in recent) and now - 3 > up:
                    normal_since = now - 3
                    break
            marks["normal service"] = normal_since if normal_since is not None else float("nan")
            marks["replica B killed"] = time.monotonic() - T0
            sb.kill()
            cmd = service_command(port_b, a.models_dir, Path(tmp) / "b2", args)
            with open(Path(tmp) / "b2.log", "wb") as f:
                b2 = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                      env={**os.environ, "EMBED_DRAIN_S": "0"})  # fmt: skip
            wait_ready(sb.url, b2)
            marks["replica B back"] = time.monotonic() - T0
            time.sleep(a.tail_s)
            stop.set()
            for w in workers:
                w.join(timeout=150)
            b2.send_signal(signal.SIGTERM)
            b2.wait(timeout=60)
        mc = milvus_client(m.uri, m.token)
        total = int(mc.query("fault_fault", filter="", output_fields=["count(*)"])[0]["count(*)"])
        keys, found = sorted(acked), set()
        for i in range(0, len(keys), 1000):
            expr = f"key in {json.dumps([json.dumps(k) for k in keys[i : i + 1000]])}"
            found |= {json.loads(r["key"]) for r in mc.query("fault_fault", filter=expr, output_fields=["key"])}
        mc.close()
    load1 = os.getloadavg()
    report(log, acked, found, total, marks, model, load0, load1)
    return 0


def report(log: Log, acked: set, found: set, total: int, marks: dict, model: str, load0, load1) -> None:
    print(f"CPU: {model}; load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    print("events (s since start): " + ", ".join(f"{k} {v:.1f}" for k, v in marks.items()) + "\n")
    per_s: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    worst: dict[int, dict[str, float]] = collections.defaultdict(lambda: {"health": 0.0, "embed": 0.0, "coll": 0.0})
    for sec, _, op, status, dt in log.rows:
        if op in ("health", "embed"):
            worst[sec][op] = max(worst[sec][op], dt)
        else:
            per_s[sec][status] += 1
            worst[sec]["coll"] = max(worst[sec]["coll"], dt)
    print("| s | collection requests by status | worst collection request | worst /health | worst embedding |")
    print("|---|---|---|---|---|")
    for sec in sorted(set(per_s) | set(worst)):
        counts = " ".join(f"{k}:{v}" for k, v in sorted(per_s[sec].items())) or "-"
        w = worst[sec]
        print(f"| {sec} | {counts} | {w['coll']:.2f} s | {w['health'] * 1000:.0f} ms | {w['embed'] * 1000:.0f} ms |")
    lost, extra = acked - found, total - len(found)
    n500 = sum(1 for r in log.rows if r[3] >= 500 and r[3] != 503)
    health = [r[4] for r in log.rows if r[2] == "health" and r[3] == 200]
    coll = [r[4] for r in log.rows if r[2] in ("upsert", "search", "info") and r[3] in (200, 503)]
    recovery = marks["normal service"] - marks["milvus answers"]
    print()
    print("| measure | value | goal |\n|---|---|---|")
    print(
        f"| points acknowledged / lost / extra (applied, answered 503) | {len(acked)} / {len(lost)} / {extra} | 0 lost |"
    )
    print(f"| 500 answers | {n500} | 0 |")
    print(f"| worst /health (answered) | {max(health) * 1000:.0f} ms | < 100 ms |")
    print(f"| worst collection request (200 or 503) | {max(coll):.2f} s | <= write timeout (10 s) + 1 s |")
    print(f"| normal service after Milvus answers again | {recovery:.1f} s | <= 15 s |")


if __name__ == "__main__":
    sys.exit(main())
