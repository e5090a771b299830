"""``python -m training eval --model PATH``: STS suite ("all" setting) on a model, printed as a table.

PATH is a Hugging Face / sentence-transformers directory (torch, pooling from its
sentence-transformers config, else mean) or an ONNX artifact directory (``model.onnx`` +
``manifest.json``; onnxruntime + tokenizers + ``artifact_contract.postprocess``).

Options: ``--tasks STS12,STSBenchmark-dev`` (default: the seven test tasks + mean),
``--max-seq-length N`` (default 128 for torch, the manifest's for ONNX), ``--batch-size N``,
``--align-uniform`` (also Wang & Isola alignment/uniformity on STS-B), ``--json FILE``,
``--limit N`` (a fixed random subsample of N pairs per task: quick checks only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str]) -> int:
    """Evaluate and print; returns 0, or 2 when the path is not a model."""
    from training.data.sts import TEST_TASKS
    from training.evaluation import alignment_uniformity, encode_fn_for, evaluate_sts, format_table

    ap = argparse.ArgumentParser(prog="python -m training eval", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF/ST directory or ONNX artifact directory")
    ap.add_argument("--tasks", default=",".join(TEST_TASKS))
    ap.add_argument("--max-seq-length", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--align-uniform", action="store_true")
    ap.add_argument("--json", default=None, help="also write the scores to this JSON file")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--limit",
        type=int,
        default=None,
        help="fixed random subsample of N pairs per task (quick checks; not headline numbers)",
    )
    a = ap.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    if not os.path.isdir(a.model):
        print(f"error: {a.model} is not a directory", file=sys.stderr)
        return 2
    enc = encode_fn_for(a.model, a.max_seq_length, a.batch_size)
    scores = evaluate_sts(enc, [t for t in a.tasks.split(",") if t], limit=a.limit)
    extra = alignment_uniformity(enc, limit=a.limit) if a.align_uniform else {}
    print(f"model: {a.model}" + (f"  (random subsample of {a.limit} pairs per task)" if a.limit else ""))
    print(format_table(scores, extra))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**scores, **extra}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
