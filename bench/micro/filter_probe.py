"""BM25 on the cached hybrid collection of ``bench.micro.scale_bench --mode hybrid``, unfiltered, with the indexed 1 %
filter (``category``) and with a filter on a key no payload holds (a full payload scan), served by the code of
``--repo`` (a git worktree of another commit, to tell a code change from a change of the collection's state).

    git worktree add /tmp/old <commit>
    python -m bench.micro.filter_probe --repo /tmp/old
    python -m bench.micro.filter_probe --repo .

Prints the p50 latency of each kind (the first two queries of each unrecorded). Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import orjson

from bench.lib import REPO
from bench.lib.server import service_command, wait_ready
from harness.ports import free_port

TEXTS = [
    "the results suggest that the treatment reduces symptoms",
    "a man is playing a guitar on the stage",
    "stocks fell sharply after the central bank raised rates",
    "cats sleep most of the day in warm places",
]
KINDS = {
    "bm25, no filter": ({}, 24),
    "bm25, indexed 1 % filter": ({"filter": {"must": [{"key": "category", "match": {"value": "c07"}}]}}, 24),
    "bm25, a filter on an unindexed key": ({"filter": {"must": [{"key": "nokey", "match": {"value": "x"}}]}}, 7),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=REPO, help="the source tree whose service serves")
    ap.add_argument(
        "--work", type=Path, default=Path.home() / ".cache/embed-bench/scale_hybrid/1000000-random-projection-flat"
    )
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    a = ap.parse_args()
    port = free_port()
    args = ["--default-model", "all-minilm-l6-v2", "--log-level", "warning"]
    cmd = service_command(port, a.models_dir, a.work / "data", args)
    env = {**os.environ, "PYTHONPATH": str(a.repo.resolve())}
    log_path = a.work / "filter_probe.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=a.repo, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.time()
        wait_ready(url, proc, timeout=600, log_path=log_path)
        print(f"{a.repo}: ready in {time.time() - t0:.1f} s; load average {os.getloadavg()[0]:.2f}")
        with httpx.Client(base_url=url, timeout=600) as c:
            for name, (extra, n) in KINDS.items():
                lat = []
                for i in range(n):
                    body = {
                        "query": {"text": f"{TEXTS[i % 4]} {i}", "model": "qdrant/bm25"},
                        "using": "bm25",
                        "limit": 10,
                        "with_payload": False,
                        **extra,
                    }
                    t = time.perf_counter()
                    r = c.post(
                        "/qdrant/collections/hybrid/points/query",
                        content=orjson.dumps(body),
                        headers={"content-type": "application/json"},
                    )
                    lat.append(1000 * (time.perf_counter() - t))
                    r.raise_for_status()
                print(f"{name}: p50 {statistics.median(lat[2:]):.1f} ms over {n - 2} queries")
    finally:
        proc.terminate()
        proc.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
