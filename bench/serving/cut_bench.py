"""Time of the batcher's window cut (``service.inference.fair_queue.cut_window``), which runs on the event loop.

Windows of real STS-B test sentence lengths (the default artifact's tokenizer, a fixed random draw) and of equal
128-token lengths, at the CPU defaults' window (256 inputs, batches of 16, 2,048 padded tokens) and at GPU-sized
ones (1,024 inputs, batches of 256). Per case: the best of ``--repeat`` cuts in milliseconds and the batches made.
Run it alone; to compare with another version of ``service/inference/fair_queue.py``, run it in a checkout of that version.

Usage::

    python -m bench.serving.cut_bench [--repeat 9]

Not a test: it asserts nothing, it prints a table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.machine import cpu_model
from service.inference.fair_queue import Job, cut_window
from service.inference.onnx_encoder import Tokenized
from training.data.sts import load_stsb

#: (window inputs, max_batch_size, max_batch_tokens); overhead 16 (the batch_overhead_tokens default)
CASES = [(64, 16, 2048), (256, 16, 2048), (256, 64, 8192), (1024, 256, 16384)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    a = ap.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(a.models_dir) / "all-minilm-l6-v2" / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    test = load_stsb("test")
    stsb = np.array([len(e.ids) for e in tok.encode_batch(list(dict.fromkeys(test.sent1 + test.sent2)))])
    rng = np.random.default_rng(0)
    load0 = os.getloadavg()[0]
    print(f"CPU: {cpu_model()}; load average {load0:.2f}\n")
    print("| lengths | window | max_batch_size | max_batch_tokens | best ms | batches |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("STS-B", "128 each"):
        for n, size, tokens in CASES:
            lengths = rng.choice(stsb, n) if kind == "STS-B" else np.full(n, 128)
            job = Job(Tokenized([np.zeros(int(k), dtype=np.int64) for k in lengths]), None, None, remaining=n)
            best, batches = float("inf"), []
            for _ in range(a.repeat):
                window = [(job, i) for i in range(n)]
                t0 = time.perf_counter()
                batches = cut_window(window, max_batch_size=size, max_batch_tokens=tokens, overhead=16)
                best = min(best, time.perf_counter() - t0)
            print(f"| {kind} | {n} | {size} | {tokens} | {best * 1000:.2f} | {len(batches)} |")
    print(f"\nload average before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
