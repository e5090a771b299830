"""``python -m training interpolate --start DIR --finetuned DIR (--alpha A --out DIR | --grid A,B,... [--out DIR])``.

WiSE-FT (Wortsman et al., CVPR 2022, arXiv:2109.01903; :mod:`training.interpolate`): with ``--alpha``, writes
``(1 - alpha) * start + alpha * finetuned`` of two checkpoints of the same architecture to ``--out`` (alpha 0: the
start's weights, 1: the fine-tuned ones); mismatched weight files, tensor names or shapes are an error (exit 1).
With ``--grid``, scores each alpha on SciFact dev (the train qrels' dev split, ``--dev-fraction`` / ``--split-seed``
as ``data.dev_fraction`` / ``data.split_seed`` of the retrieval configs) and STS-B dev, prints both for every alpha
and the chosen one (best SciFact dev whose STS-B dev is at most ``--sts-tolerance`` below the start's), and writes the
chosen model to ``--out`` when given; ``--json`` is rewritten after each alpha, and a grid run again with the same
inputs reuses the alphas recorded there. ``--max-queries`` / ``--max-corpus`` / ``--sts-limit``: a smoke run's slices.

    python -m training interpolate --start DIR0 --finetuned DIR1 --alpha 0.5 --out runs/wise-ft-0.5
    python -m training interpolate --start DIR0 --finetuned DIR1 --grid 0,0.2,0.4,0.6,0.8,1 --json wise.json
"""

from __future__ import annotations

import os
import sys

from artifact_contract.fsio import atomic_write_json
from training.cli.common import command, parser, print_json


@command
def main(argv: list[str]) -> int:
    """Interpolate or choose; returns 0, 1 when the checkpoints cannot be mixed, 2 on a usage error."""
    p = parser("interpolate", __doc__)
    p.add_argument("--start", required=True, help="the model fine-tuning started from (a model directory)")
    p.add_argument("--finetuned", required=True, help="the fine-tuned model (same architecture)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--alpha", type=float, help="weight of the fine-tuned model, in [0, 1]")
    how.add_argument("--grid", help="comma list of alphas to score on dev")
    p.add_argument("--out", help="output directory (required with --alpha)")
    p.add_argument("--dev-fraction", type=float, default=0.1)
    p.add_argument("--split-seed", type=int, default=42)
    p.add_argument("--sts-tolerance", type=float, default=0.5, help="STS-B dev points below the start's allowed")
    p.add_argument("--max-seq-length", type=int, default=256, help="tokens of a SciFact text")
    p.add_argument("--max-queries", type=int)
    p.add_argument("--max-corpus", type=int)
    p.add_argument("--sts-limit", type=int, help="STS-B dev pairs subsampled (quick checks only)")
    p.add_argument(
        "--json", help="also write the result here; with --grid, rewritten after each alpha and resumed from"
    )
    a = p.parse_args(argv)
    alphas = [a.alpha] if a.alpha is not None else [float(x) for x in a.grid.split(",") if x.strip()]
    if not alphas or any(not 0.0 <= x <= 1.0 for x in alphas):
        p.error("alpha: numbers in [0, 1]")
    if a.alpha is not None and not a.out:
        p.error("--alpha needs --out")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from training.interpolate import InterpolationError, choose, interpolate_dirs

    try:
        if a.alpha is not None:
            result = interpolate_dirs(a.start, a.finetuned, a.alpha, a.out)
        else:
            result = choose(
                a.start,
                a.finetuned,
                alphas,
                dev_fraction=a.dev_fraction,
                split_seed=a.split_seed,
                sts_tolerance=a.sts_tolerance,
                max_seq_length=a.max_seq_length,
                max_queries=a.max_queries,
                max_corpus=a.max_corpus,
                sts_limit=a.sts_limit,
                record=a.json,
            )
            if a.out:
                result["out"] = interpolate_dirs(a.start, a.finetuned, result["alpha"], a.out)
    except InterpolationError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_json(result)
    if a.json:
        atomic_write_json(a.json, result)
    return 0
