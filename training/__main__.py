"""``python -m training <command>``: export | export-reranker | train | train-reranker | eval | sparse | pretrain (one module each in
training/cli/, a command's dashes underscores in its module's name)."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "export": "export an HF/sentence-transformers encoder to an ONNX artifact",
    "train": "train with SimCSE (+3R and relatives) from a config file",
    "train-reranker": "train a cross-encoder reranker on SciFact (BM25 hard negatives) and export it",
    "export-reranker": "export a local cross-encoder (CrossEncoder or HF sequence-classification dir) as it is",
    "eval": "evaluate a model directory or ONNX artifact on the STS suite",
    "sparse": "SparseCSE: importance scores, pruning, sparsity sweep",
    "pretrain": "masked-LM pretraining of a raw BERT encoder (from scratch or continued)",
    "rerank-eval": "a reranker on SciFact by the test protocol: fusion weight chosen on dev, test read once",
    "interpolate": "WiSE-FT: interpolate two checkpoints' weights, or choose the mixing weight on dev",
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to ``training.cli.<command>.main``; prints the commands and returns 2 for an unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m training {" + ",".join(COMMANDS) + "} [options]\n")
        for name, help_ in COMMANDS.items():
            print(f"  {name:14s} {help_}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(f"training.cli.{argv[0].replace('-', '_')}")
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
