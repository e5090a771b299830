"""``python -m training sparse {score,prune,sweep}``: SparseCSE from the command line (SparseCSE §2).

Examples::

    # importance once, then prune at 10/30/50%, fine-tune each with configs/sparsecse.yaml, export, measure
    python -m training sparse sweep --sparsities 0.1 0.3 0.5 --output runs/sparse_sweep \\
        --finetune-config configs/sparsecse.yaml --models-dir models

    # no fine-tuning (prune + rewind only), dev-set STS on the exported graph
    python -m training sparse sweep --sparsities 0.1 0.3 --output runs/sparse_nofit --eval dev

    python -m training sparse score --output runs/sparse/importance.json
    python -m training sparse prune --importance runs/sparse/importance.json --sparsity 0.2 --output runs/sparse/p20

Options after ``--set`` are trainer overrides for fine-tuning (``--set max_steps=50 batch_size=32``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from training.cli.common import ConfigError, command, parser
from training.config import parse_assignments
from training.data.sts import REPO_ROOT


def _overrides(items: list[str] | None) -> dict:
    try:
        return parse_assignments(items or [])
    except ValueError as e:
        raise ConfigError(f"--set: {e}") from None


def _score(args):
    from training.sparse_pipeline import score_model

    return score_model(
        args.model,
        lam=args.lam,
        min_score=args.min_gold,
        batch_size=args.score_batch_size,
        max_batches=args.score_batches or None,
    )


def cmd_score(args) -> int:
    """``score``: importance of heads and FFN neurons (SparseCSE §2.3) written as JSON to ``--output``; returns 0."""
    imp = _score(args)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(imp.to_json()))
    print(f"importance over {imp.n_batches} batches (mean L_score {imp.mean_score_loss:.4f}) -> {args.output}")
    return 0


def cmd_prune(args) -> int:
    """``prune``: prune at ``--sparsity`` by the ``--importance`` JSON and rewind the kept units (SparseCSE §2.2) into
    the model directory ``--output``; prints parameter counts, sparsities and kept units per layer; returns 0."""
    from training.sparse.importance import Importance
    from training.sparse_pipeline import prune_model_dir

    imp = Importance.from_json(json.loads(Path(args.importance).read_text()))
    st = prune_model_dir(imp, args.sparsity, args.output, rewind_to=args.rewind_to)
    print(
        json.dumps(
            {k: st.meta[k] for k in ("params_before", "params_after")}
            | {
                "head_sparsity": st.head_sparsity,
                "neuron_sparsity": st.neuron_sparsity,
                "heads_per_layer": [len(h) for h in st.heads],
                "ffn_per_layer": [len(n) for n in st.neurons],
            },
            indent=1,
        )
    )
    return 0


def _subsample_scores(artifact: Path, which: str, limit: int, threads: int) -> dict:
    """STS on the exported ONNX graph over ``training.evaluation.subsample``'s fixed N pairs per task
    (the CPU-bench protocol of bench/train_bench.py); ``mean`` over the seven test tasks when ``which == "all"``."""
    import numpy as np

    from training.data.sts import TEST_TASKS
    from training.evaluation import evaluate_sts, onnx_encode_fn

    enc = onnx_encode_fn(str(artifact), threads=threads)
    tasks = ["STSBenchmark-dev"] + (list(TEST_TASKS) if which == "all" else [])
    sc = evaluate_sts(enc, tasks, with_mean=False, limit=limit)
    if which == "all":
        sc["mean"] = float(np.mean([sc[t] for t in TEST_TASKS]))
    return sc


def cmd_sweep(args) -> int:
    """``sweep``: score once (reusing ``output/importance.json`` unless ``--rescore``), then per sparsity prune, rewind,
    optionally fine-tune, export to ``--models-dir`` and measure; rows go to ``output/sweep.jsonl`` and a Markdown
    table to stdout. Returns 0; a malformed ``--set`` raises :class:`ConfigError` before any work."""
    import torch

    from training.sparse.importance import Importance
    from training.sparse_pipeline import (
        artifact_stats,
        export_pruned,
        finetune_pruned,
        prune_model_dir,
        throughput_sentences,
    )

    ov = _overrides(args.set)  # a malformed --set fails before any work
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    imp_path = out / "importance.json"
    t0 = time.perf_counter()
    if imp_path.is_file() and not args.rescore:
        imp = Importance.from_json(json.loads(imp_path.read_text()))
    else:
        imp = _score(args)
        imp_path.write_text(json.dumps(imp.to_json()))
    score_s = time.perf_counter() - t0
    sents = throughput_sentences(args.throughput_sentences)
    models_dir = Path(args.models_dir)
    rows = []
    for s in args.sparsities:
        tag = f"s{int(round(s * 100)):02d}"
        t1 = time.perf_counter()
        if s == 0:
            from training.st_dir import default_model_dir

            model_dir = Path(args.rewind_to or default_model_dir())
            pruned_dir = model_dir
            st = None
        else:
            pruned_dir = out / tag / "pruned"
            st = prune_model_dir(imp, s, pruned_dir, rewind_to=args.rewind_to)
            model_dir = pruned_dir
        if args.finetune_config or ov:
            model_dir = finetune_pruned(
                pruned_dir, out / tag / "finetune", config_file=args.finetune_config, overrides=ov
            )
        name = f"{args.name_prefix}-{tag}"
        man = export_pruned(
            model_dir,
            models_dir / name / "1",
            name=name,
            evaluate="none" if args.eval_limit else args.eval,
            training={
                "method": "SparseCSE (SparseCSE)",
                "sparsity": s,
                "finetune_config": args.finetune_config,
                "overrides": ov,
                "lam": args.lam,
                "min_gold": args.min_gold,
            },
        )
        scores = dict(man.scores)
        if args.eval_limit and args.eval != "none":
            scores = _subsample_scores(models_dir / name / "1", args.eval, args.eval_limit, args.ort_threads)
        stats = artifact_stats(models_dir / name / "1", model_dir, sents, threads=args.ort_threads)
        row = {
            "sparsity": s,
            "artifact": name,
            "head_sparsity": st.head_sparsity if st else 0.0,
            "neuron_sparsity": st.neuron_sparsity if st else 0.0,
            "heads_per_layer": [len(h) for h in st.heads] if st else None,
            "ffn_per_layer": [len(n) for n in st.neurons] if st else None,
            **stats,
            "scores": scores,
            "eval_limit": args.eval_limit or None,
            "seconds": time.perf_counter() - t1,
        }
        rows.append(row)
        with open(out / "sweep.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k not in ("heads_per_layer", "ffn_per_layer")}), flush=True)
    print(f"\nscoring: {score_s:.1f}s over {imp.n_batches} batches")
    keys = sorted({k for r in rows for k in r["scores"]})
    print("| sparsity | heads kept | FFN kept | params | ONNX MB | sent/s | " + " | ".join(keys) + " |")
    for r in rows:
        print(
            f"| {r['sparsity']:.2f} | {1 - r['head_sparsity']:.0%} | {1 - r['neuron_sparsity']:.0%} | "
            f"{r['params'] / 1e6:.2f}M | {r['onnx_bytes'] / 2**20:.1f} | {r['sent_per_s']:.0f} | "
            + " | ".join(f"{r['scores'].get(k, float('nan')):.2f}" for k in keys)
            + " |"
        )
    return 0


@command
def main(argv: list[str]) -> int:
    """Parse ``argv`` and run the sub-command; returns the exit status (2 on a usage error)."""
    p = parser("sparse", __doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    def scoring(sp):
        sp.add_argument("--model", default=None, help="scored model directory (default: the default encoder)")
        sp.add_argument("--lam", type=float, default=0.5, help="λ of L_score (SparseCSE §2.3)")
        sp.add_argument("--min-gold", type=float, default=4.0, help="STS-B train gold >= this is a positive pair")
        sp.add_argument("--score-batch-size", type=int, default=32)
        sp.add_argument("--score-batches", type=int, default=16, help="0: every positive pair")

    sp = sub.add_parser("score", help="importance scores -> JSON")
    scoring(sp)
    sp.add_argument("--output", required=True)
    sp.set_defaults(fn=cmd_score)

    sp = sub.add_parser("prune", help="prune + rewind at one sparsity -> pruned model directory")
    sp.add_argument("--importance", required=True)
    sp.add_argument("--sparsity", type=float, required=True)
    sp.add_argument("--rewind-to", default=None)
    sp.add_argument("--output", required=True)
    sp.set_defaults(fn=cmd_prune)

    sp = sub.add_parser("sweep", help="score once; per sparsity prune, rewind, fine-tune, export, measure")
    scoring(sp)
    sp.add_argument("--sparsities", type=float, nargs="+", required=True, help="e.g. 0 0.1 0.3 0.5 (0: unpruned)")
    sp.add_argument("--rewind-to", default=None, help="weights the kept units take (default: the default encoder)")
    sp.add_argument(
        "--finetune-config", default=None, help="trainer YAML for the fine-tuning stage (e.g. configs/sparsecse.yaml)"
    )
    sp.add_argument("--set", nargs="*", help="trainer overrides key=value for fine-tuning")
    sp.add_argument("--output", required=True)
    sp.add_argument("--models-dir", default=str(REPO_ROOT / "models"))
    sp.add_argument("--name-prefix", default="minilm-sparsecse")
    sp.add_argument("--eval", choices=["none", "dev", "all"], default="dev", help="STS measured on the exported ONNX")
    sp.add_argument(
        "--eval-limit",
        type=int,
        default=0,
        help="fixed random subsample of N pairs per task (as bench/train_bench.py); 0: full tasks",
    )
    sp.add_argument("--throughput-sentences", type=int, default=512)
    sp.add_argument("--ort-threads", type=int, default=1)
    sp.add_argument("--threads", type=int, default=None, help="torch threads")
    sp.add_argument("--rescore", action="store_true", help="recompute importance even if output/importance.json exists")
    sp.set_defaults(fn=cmd_sweep)

    args = p.parse_args(argv)
    return int(args.fn(args) or 0)
