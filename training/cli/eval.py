"""``python -m training eval --model PATH``: STS suite ("all" setting) and SentEval transfer tasks on a model.

PATH is a Hugging Face / sentence-transformers directory (torch, pooling from its
sentence-transformers config, else mean) or an ONNX artifact directory (``model.onnx`` +
``manifest.json``; onnxruntime + tokenizers + ``artifact_contract.postprocess``).

Options: ``--tasks sts|transfer|all`` or a comma list of task names (``STS12,STSBenchmark-dev,MR,TREC``;
default ``sts``: the seven STS test tasks + mean; ``transfer``: MR, CR, SUBJ, MPQA, SST2, TREC, MRPC + average,
SentEval's logistic-regression protocol, see :mod:`training.transfer`; ``all``: both), ``--kfold N`` (transfer
cross-validation folds, default 10), ``--pooling cls|mean`` (torch models; default: the sentence-transformers
config, else mean),
``--max-seq-length N`` (default 128 for torch, the manifest's for ONNX), ``--batch-size N``,
``--align-uniform`` (also Wang & Isola alignment/uniformity on STS-B), ``--json FILE``,
``--limit N`` (a fixed random subsample of N pairs per STS task / N examples per transfer split: quick checks only).
"""

from __future__ import annotations

import json
import os
import sys

from training.cli.common import command, parser

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@command
def main(argv: list[str]) -> int:
    """Evaluate and print; returns 0, or 2 when the path is not a model."""
    from training.data.sts import TEST_TASKS
    from training.data.transfer import TRANSFER_TASKS
    from training.evaluation import alignment_uniformity, encode_fn_for, evaluate_sts, format_table

    ap = parser("eval", __doc__)
    ap.add_argument("--model", required=True, help="HF/ST directory or ONNX artifact directory")
    ap.add_argument("--tasks", default="sts", help="sts | transfer | all | comma list of task names")
    ap.add_argument("--kfold", type=int, default=10, help="transfer-task cross-validation folds")
    ap.add_argument("--pooling", choices=["cls", "mean"], default=None, help="torch models only")
    ap.add_argument("--max-seq-length", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--align-uniform", action="store_true")
    ap.add_argument("--json", default=None, help="also write the scores to this JSON file")
    ap.add_argument("--threads", type=int, default=None, help="torch and onnxruntime intra-op threads")
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
    groups = {"sts": list(TEST_TASKS), "transfer": list(TRANSFER_TASKS), "all": [*TEST_TASKS, *TRANSFER_TASKS]}
    names = groups.get(a.tasks) or [t for t in a.tasks.split(",") if t]
    enc = encode_fn_for(a.model, a.max_seq_length, a.batch_size, pooling=a.pooling, threads=a.threads)
    sts = [t for t in names if t not in TRANSFER_TASKS]
    scores = evaluate_sts(enc, sts, limit=a.limit) if sts else {}
    transfer = [t for t in names if t in TRANSFER_TASKS]
    if transfer:
        from training.transfer import evaluate_transfer

        scores.update(evaluate_transfer(enc, transfer, kfold=a.kfold, limit=a.limit))
    extra = alignment_uniformity(enc, limit=a.limit) if a.align_uniform else {}
    print(f"model: {a.model}" + (f"  (random subsample of {a.limit} pairs per task)" if a.limit else ""))
    print(format_table(scores, extra))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({**scores, **extra}, f, indent=2)
    return 0
