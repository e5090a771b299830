"""One reranker batch of 100 (claim, SciFact abstract) pairs at 256 tokens, without the service: the cost of
tokenizing it (one ``Tokenizer.encode_batch`` call) and of one ONNX Runtime run on CUDA in fp32, with TF32, and in
fp16 (``onnxruntime.transformers.float16.convert_float_to_float16``, inputs and outputs kept float32), with the
largest score difference fp16 makes. What bounds a served ``POST /rerank`` of 100 candidates, below the service.

Usage (on the device, after ``bench/device/kit.sh install``; a kit carrying ``scifact-reranker-tiny``)::

    PYTHONPATH=/tmp/site python3 bench/device/rerank_probe.py [--model models/scifact-reranker-tiny]

Not a test: it prints milliseconds (median of 20 runs after 3 warm-up runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np


def timed(name: str, session, feed: dict) -> np.ndarray:
    """Run ``session`` on ``feed`` 3 times unrecorded, then 20 times; print the median ms; return the scores."""
    for _ in range(3):
        session.run(None, feed)
    ms = []
    for _ in range(20):
        t0 = time.perf_counter()
        out = session.run(None, feed)[0]
        ms.append(1000 * (time.perf_counter() - t0))
    print(f"{name}: {statistics.median(ms):.2f} ms")
    return out


def main() -> int:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/scifact-reranker-tiny")
    ap.add_argument("--corpus", default=os.path.join(os.environ.get("SHARED_DATA_DIR", "/tmp/shared/data"),
                                                     "beir/scifact/corpus.jsonl"))  # fmt: skip
    ap.add_argument("--pairs", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    ort.preload_dlls()
    tok = Tokenizer.from_file(f"{a.model}/tokenizer.json")
    tok.enable_truncation(a.tokens)
    tok.enable_padding()
    with open(a.corpus, encoding="utf-8") as f:
        docs = [json.loads(line) for line, _ in zip(f, range(a.pairs))]
    pairs = [("does the treatment reduce symptoms in patients", f"{d['title']} {d['text']}") for d in docs]
    t0 = time.perf_counter()
    for _ in range(10):
        enc = tok.encode_batch(pairs)
    print(f"tokenize {a.pairs} pairs (one encode_batch): {100 * (time.perf_counter() - t0):.2f} ms")
    feed = {
        "input_ids": np.array([e.ids for e in enc], np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
    }
    path = f"{a.model}/model.onnx"
    fp32 = timed("fp32", ort.InferenceSession(path, providers=["CUDAExecutionProvider"]), feed)
    timed("fp32 + TF32", ort.InferenceSession(path, providers=[("CUDAExecutionProvider", {"use_tf32": 1})]), feed)
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    half = convert_float_to_float16(onnx.load(path), keep_io_types=True)
    fp16 = timed("fp16", ort.InferenceSession(half.SerializeToString(), providers=["CUDAExecutionProvider"]), feed)
    print(f"fp16 max abs difference from fp32: {float(np.abs(fp32 - fp16).max()):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
