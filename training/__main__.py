"""``python -m training <command>``: export | train | eval | sparse | pretrain."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "export": ("training.export", "export an HF/sentence-transformers encoder to an ONNX artifact"),
    "train": ("training.cli_train", "train with SimCSE (+3R and relatives) from a config file"),
    "eval": ("training.cli_eval", "evaluate a model directory or ONNX artifact on the STS suite"),
    "sparse": ("training.sparse.__main__", "SparseCSE: importance scores, pruning, sparsity sweep"),
    "pretrain": ("training.pretrain.cli", "masked-LM pretraining of a raw BERT encoder (from scratch or continued)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m training {" + ",".join(COMMANDS) + "} [options]\n")
        for name, (_, help_) in COMMANDS.items():
            print(f"  {name:8s} {help_}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
