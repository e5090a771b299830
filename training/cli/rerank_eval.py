"""``python -m training rerank-eval --model DIR [--first-stage dbsf] [--encoder DIR] [--alphas 0,0.1,...,1] ...``.

The offline evaluation of a reranker (:mod:`training.rerank_protocol`): the dev claims (carved from SciFact's train
qrels, the split the reranker was chosen on: ``done.json``'s ``dev_queries`` when ``--model`` is a training run's
``model/``, else ``--dev-fraction`` / ``--seed`` as ``train-reranker`` splits) have their first stage reranked at each
alpha of the grid (the weight of the reranker's score fused with the first stage's; 1: the reranker alone), the best
alpha on dev is chosen, then the test qrels are read once: the first stage, alpha 1 and the chosen alpha on test,
and the dev - test gap of each. ``--model``: a ``CrossEncoder`` directory or an ONNX reranker artifact. Several
first stages (``--first-stage dbsf,rrf,dense,bm25``) score each distinct pair once (:mod:`training.pair_score_cache`;
``--score-cache FILE`` keeps the scores across runs and resumes an interrupted one).

A seconds-long smoke run on a slice (not the dataset's numbers)::

    python -m training rerank-eval --model models/scifact-reranker-tiny --max-queries 24 --max-corpus 150 \\
        --dev-fraction 0.25 --max-test-queries 6 --depth 10 --max-length 128
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from artifact_contract.fsio import atomic_write_json
from training.cli.common import command, parser, print_json


@command
def main(argv: list[str]) -> int:
    """Evaluate and print the JSON result; returns 0 (2 on a usage error)."""
    from training.rerank_protocol import DEFAULT_ALPHAS, FIRST_STAGES

    p = parser("rerank-eval", __doc__)
    p.add_argument("--model", required=True, help="CrossEncoder directory or ONNX reranker artifact")
    p.add_argument(
        "--first-stage", default="dbsf", help=f"{', '.join(FIRST_STAGES)}, or several comma-separated (default: dbsf)"
    )
    p.add_argument("--encoder", help="bi-encoder of the dense part (default: the default encoder)")
    p.add_argument("--depth", type=int, default=100, help="first-stage candidates per claim (default: 100)")
    p.add_argument("--alphas", default=",".join(f"{a:g}" for a in DEFAULT_ALPHAS), help="grid of alpha in [0, 1]")
    p.add_argument("--dev-fraction", type=float, default=0.1, help="as train-reranker (default: 0.1)")
    p.add_argument("--seed", type=int, default=42, help="split seed, as train-reranker (default: 42)")
    p.add_argument("--max-queries", type=int, help="train queries kept (a smoke run; as train-reranker)")
    p.add_argument("--max-corpus", type=int, help="corpus slice (a smoke run)")
    p.add_argument("--max-test-queries", type=int, help="test queries kept (a seeded sample; a smoke run)")
    p.add_argument("--max-length", type=int, default=256, help="tokens of a pair (CrossEncoder directories)")
    p.add_argument("--json", help="also write the result here (several first stages: {runs: [...]}, after each)")
    p.add_argument(
        "--score-cache", help="JSON file of the reranker's pair scores, reused across first stages and runs (resumable)"
    )
    a = p.parse_args(argv)
    kinds = [k.strip() for k in a.first_stage.split(",") if k.strip()]
    if not kinds or any(k not in FIRST_STAGES for k in kinds):
        p.error(f"--first-stage: one or more of {', '.join(FIRST_STAGES)}, comma-separated")
    alphas = [float(x) for x in a.alphas.split(",") if x.strip()]
    if not alphas or any(not 0.0 <= x <= 1.0 for x in alphas):
        p.error("--alphas: numbers in [0, 1]")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from training.data.scifact import load_scifact, split_queries
    from training.pair_score_cache import PairScoreCache, model_stamp
    from training.rerank_protocol import evaluate, pair_scorer

    data = load_scifact(a.max_queries, a.max_corpus, a.seed)
    done = Path(a.model) / "done.json"
    dev_q = json.loads(done.read_text())["dev_queries"] if done.is_file() else None
    dev_q = (
        [q for q in dev_q if q in data.qrels] if dev_q else split_queries(list(data.qrels), a.dev_fraction, a.seed)[1]
    )

    def load_test():
        return load_scifact(a.max_test_queries, a.max_corpus, a.seed, split="test")

    inputs = {"model": model_stamp(a.model), "max_length": a.max_length}
    scorer = PairScoreCache(pair_scorer(a.model, a.max_length), a.score_cache, inputs)
    runs = []
    for kind in kinds:
        out = evaluate(scorer, data, dev_q, load_test, kind, a.depth, a.encoder, alphas)
        runs.append({"model": a.model, "encoder": a.encoder or "default encoder", **out})
        result = runs[0] if len(kinds) == 1 else {"runs": runs}
        if a.json:  # after each first stage: a later one cut short keeps the earlier ones
            atomic_write_json(a.json, result)
    print_json(result)
    return 0
