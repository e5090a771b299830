"""WiSE-FT of a SciFact-fine-tuned encoder: every mixing weight alpha scored in-domain and on general tasks, the
choice made on dev only, test reported for every alpha beside it.

WiSE-FT (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022, arXiv:2109.01903, Eq. 1):
``theta_alpha = (1 - alpha) * theta_start + alpha * theta_ft`` (``training.interpolate.interpolate_dirs``). For each
alpha of ``--grid`` (alpha 0, the start, always) one encoding of SciFact's 5,183 abstracts at 256 tokens serves both
query sets: nDCG@10 of the 81 dev claims carved from the train qrels (split seed 42, as the fine-tuning runs carve
them) and nDCG@10 / Recall@100 of the 300 test claims (BEIR's test qrels), exact cosine search; STS-B dev and test
Spearman x100 at 128 tokens. The alpha is chosen by ``training.interpolate.pick`` (best SciFact dev among the alphas
whose STS-B dev is at most ``--sts-tolerance`` below the start's), which reads only the dev columns: the test columns
are reported, never used. ``--transfer 0,chosen,1``: SentEval's seven transfer tasks (``python -m training eval --tasks
transfer``'s protocol: ~24 min a model in torch on a 2-core CPU) for those alphas. ``--out DIR``: the chosen model
written there.

    python -m bench.quality.wise_ft --finetuned /work/runs/ft/best --grid 0.2,0.4,0.5,0.6,0.8,1 \\
        --json /work/runs/wise.json --out /work/runs/wise-chosen [--transfer chosen]

Resumable: ``--json`` is rewritten after each alpha; a run with the same inputs (weight files by size and mtime)
skips the alphas found there. Prints the CPU and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from artifact_contract.fsio import atomic_write_json
from bench.lib.machine import cpu_model

TRANSFER = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")


def memo_encode(encode):
    """``encode`` with the last call's texts and embeddings remembered: the corpus, encoded once for the dev and the
    test queries of one alpha."""
    last: dict[str, Any] = {}

    def fn(texts):
        if last.get("texts") != texts:
            last["texts"], last["emb"] = texts, encode(texts)
        return last["emb"]

    return fn


def score_alpha(model: str, dev, test, dev_q: list[str], max_seq_length: int) -> dict[str, float]:
    """SciFact dev/test and STS-B dev/test of one model directory (module docstring)."""
    from training.evaluation import encode_fn_for, evaluate_sts
    from training.retrieval import evaluate_retrieval

    enc = memo_encode(encode_fn_for(model, max_seq_length))
    d = evaluate_retrieval(enc, dev, dev_q)
    t = evaluate_retrieval(enc, test)
    sts = evaluate_sts(encode_fn_for(model, 128), ["STSBenchmark-dev", "STSBenchmark"], with_mean=False)
    return {
        "scifact-dev-ndcg@10": d["ndcg@10"],
        "stsb-dev": sts["STSBenchmark-dev"],
        "scifact-test-ndcg@10": t["ndcg@10"],
        "scifact-test-recall@100": t["recall@100"],
        "stsb-test": sts["STSBenchmark"],
    }


def main() -> None:
    from training.data.scifact import load_scifact, split_queries
    from training.interpolate import grid, interpolate_dirs, pick
    from training.st_dir import default_model_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", default=None, help="the model fine-tuning started from (default: the default encoder)")
    ap.add_argument("--finetuned", required=True)
    ap.add_argument("--grid", default="0.2,0.4,0.5,0.6,0.8,1")
    ap.add_argument("--sts-tolerance", type=float, default=0.5)
    ap.add_argument("--max-seq-length", type=int, default=256)
    ap.add_argument("--transfer", default="", help="alphas (or 'chosen') to run SentEval's transfer tasks for")
    ap.add_argument("--json", required=True, help="results, rewritten after each alpha (resumed from)")
    ap.add_argument("--out", help="write the chosen model here")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = a.start or str(default_model_dir())
    load0 = os.getloadavg()
    print(f"CPU: {cpu_model()}; load average before {load0[0]:.2f}", flush=True)
    dev, test = load_scifact(seed=42), load_scifact(split="test")
    dev_q = split_queries(list(dev.qrels), 0.1, 42)[1]
    rows, inputs = grid(
        start,
        a.finetuned,
        [float(x) for x in a.grid.split(",") if x.strip()],
        lambda model: score_alpha(model, dev, test, dev_q, a.max_seq_length),
        settings=["wise_ft bench", 0.1, 42, a.max_seq_length],
        record=a.json,
    )
    result: dict[str, Any] = {"rows": rows, "inputs": inputs, "cpu": cpu_model()}
    for row in rows:
        print(row, flush=True)
    with tempfile.TemporaryDirectory(prefix="wise-ft-") as tmp:
        result["alpha"], result["rule"] = pick(result["rows"], a.sts_tolerance)
        wanted = {result["alpha"] if x.strip() == "chosen" else float(x) for x in a.transfer.split(",") if x.strip()}
        _transfer(result, wanted, start, a.finetuned, Path(tmp), a.json)
    if a.out:
        interpolate_dirs(start, a.finetuned, result["alpha"], a.out)
    load1 = os.getloadavg()
    result["load"] = [round(load0[0], 2), round(load1[0], 2)]
    atomic_write_json(a.json, result)
    _print_table(result)
    print(f"load average after {load1[0]:.2f}", flush=True)


def _transfer(result: dict[str, Any], wanted: set[float], start: str, finetuned: str, tmp: Path, out: str) -> None:
    """SentEval transfer accuracy (``training.transfer``'s protocol) for the ``wanted`` alphas, each recorded in its
    row (skipped when already there)."""
    from training.evaluation import encode_fn_for
    from training.interpolate import interpolate_dirs
    from training.transfer import evaluate_transfer

    for row in result["rows"]:
        if row["alpha"] not in wanted or "transfer" in row:
            continue
        d = tmp / f"transfer-{row['alpha']:g}"
        interpolate_dirs(start, finetuned, row["alpha"], d)
        row["transfer"] = evaluate_transfer(encode_fn_for(str(d), 128), list(TRANSFER))
        shutil.rmtree(d)
        atomic_write_json(out, result)


def _print_table(result: dict[str, Any]) -> None:
    cols = ["scifact-dev-ndcg@10", "stsb-dev", "scifact-test-ndcg@10", "scifact-test-recall@100", "stsb-test"]
    print(
        "| alpha | SciFact dev nDCG@10 | STS-B dev | SciFact test nDCG@10 | test Recall@100 | STS-B test | transfer avg |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        mark = " (chosen)" if r["alpha"] == result["alpha"] else ""
        avg = r.get("transfer", {}).get("transfer_avg")
        cells = " | ".join(f"{r[c]:.2f}" for c in cols)
        print(f"| {r['alpha']:g}{mark} | {cells} | {'' if avg is None else f'{avg:.2f}'} |")
    print(f"rule: {result['rule']}")


if __name__ == "__main__":
    main()
