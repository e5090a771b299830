"""Cost of one inference batch by shape (not in CI; run alone on the machine): what ``max_batch_tokens`` trades.

The service's ONNX session (``service.backend.OnnxModel``, the default artifact) runs batches of ``n`` inputs of
``L`` tokens, the shapes interleaved round after round so that load drift hits them alike. Per shape: median
milliseconds per batch (how long a request that arrives meanwhile waits for it) and median microseconds per
padded token (throughput). On CPU the per-token cost does not fall with bigger batches, so a small
``max_batch_tokens`` bounds the wait for free; on a GPU it does, and the budget should be raised.

Usage::

    python bench/batch_shape_bench.py [--threads 2] [--rounds 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.backend import OnnxModel  # noqa: E402

SHAPES = [(2, 256), (4, 256), (8, 256), (16, 256), (16, 128), (16, 64), (16, 32)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--artifact", default=str(REPO / "models" / "all-minilm-l6-v2"))
    a = ap.parse_args(argv)
    m = OnnxModel(a.artifact, providers=["auto"], intra_op_threads=a.threads)
    m.warm_up(batch_size=2)
    feeds = {}
    for n, L in SHAPES:
        ids = np.full((n, L), 1037, np.int64)  # one ordinary word-piece id, [CLS] ... [SEP]
        ids[:, 0], ids[:, -1] = 101, 102
        feeds[(n, L)] = (ids, np.ones_like(ids))
        m.run(*feeds[(n, L)])
    times: dict[tuple[int, int], list[float]] = {k: [] for k in SHAPES}
    load0 = os.getloadavg()[0]
    for _ in range(a.rounds):
        for k in SHAPES:
            t0 = time.perf_counter()
            m.run(*feeds[k])
            times[k].append(time.perf_counter() - t0)
    print(f"providers {m.providers}; ORT threads {a.threads}; {a.rounds} rounds; "
          f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    print("| batch | padded tokens | ms per batch (median) | us per token (median) |\n|---|---|---|---|")
    for (n, L), ts in times.items():
        med = statistics.median(ts)
        print(f"| {n} x {L} | {n * L} | {med * 1000:.0f} | {med / (n * L) * 1e6:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
