"""``python -m training train-reranker [--output-dir DIR] [--model DIR] [--max-steps N] [--publish MODELS_DIR] ...``.

Trains a cross-encoder reranker on BEIR SciFact's train qrels with mined hard negatives (sentence-transformers'
``CrossEncoderTrainer``, a pointwise, contrastive or listwise loss; :mod:`training.reranker`), choosing the checkpoint on a dev split
carved from train by query (the dev claims' first-stage top ``--dev-depth`` reranked, nDCG@10: the test protocol on
dev, :mod:`training.rerank_protocol`), and with ``--publish`` exports it as the next version of ``--artifact-name`` in
``MODELS_DIR`` (an artifact with ``task: "reranker"``, served by ``/rerank``, ``/v1/rerank`` and ``/v2/rerank`` once
loaded: ``--rerank-models NAME`` or ``POST /admin/models/NAME/load``). A finished run of the same recipe is not
trained again, an interrupted one resumes from its newest checkpoint (``--no-resume``: start over). ``--quantize int8``
also publishes ``<artifact-name>-int8``, the fp32 artifact dynamically quantised (ONNX Runtime, QInt8 weights); ``--dtype fp16``
also publishes ``<artifact-name>-fp16``, its fp16 twin for GPU serving (the service refuses it on a CPU).

A short CPU run::

    python -m training train-reranker --output-dir runs/rr-smoke --max-steps 20 --max-queries 40 --publish models/

Distillation from the first stage (its DBSF scores of each train claim's 30 best candidates, mixed with the labels
half and half; ``training.rerank_distill``)::

    python -m training train-reranker --loss listwise_kl --teacher dbsf --candidates-per-query 30 --label-weight 0.5
"""

from __future__ import annotations

import dataclasses
import logging

from training.cli.common import command, parser, print_json

HELP = {
    "output_dir": "run directory: checkpoints/ (resumed from), model/ (the chosen model, done.json)",
    "model_dir": "local Hugging Face / sentence-transformers directory to start from (default: the default encoder)",
    "max_seq_length": "tokens of a (query, passage) pair, longest side truncated first",
    "max_steps": "optimizer steps",
    "batch_size": "pairs per step",
    "lr": "peak learning rate (AdamW, linear decay)",
    "warmup_ratio": "fraction of max_steps warming the learning rate up",
    "negatives_per_query": "mined hard negatives per query (its judged documents excluded)",
    "negatives": "who mines them: bm25, dense (the default bi-encoder) or bm25+dense (interleaved)",
    "loss": "bce (pos-weighted binary cross-entropy), mnrl (InfoNCE over mined + in-batch negatives), lambda "
    "(listwise LambdaLoss), margin_mse or listwise_kl (distillation from --teacher mixed with the labels); choose by "
    "the dev nDCG@10",
    "dev_fraction": "fraction of the train queries held out as the dev split (model choice, parity pairs)",
    "max_queries": "use this many train queries (a seeded sample; default all 809)",
    "max_corpus": "keep the positives plus the first N abstracts (default all 5,183)",
    "eval_steps": "score the dev split and checkpoint every N steps (0: at the end); the best dev nDCG@10 is kept",
    "seed": "data split, sampling and initialisation seed",
    "artifact_name": "name of the published artifact (MODELS_DIR/NAME/<next version>/)",
    "quantize": "int8: also publish NAME-int8, the fp32 artifact dynamically quantised",
    "dtype": "fp16: also publish NAME-fp16, the fp32 artifact's fp16 twin for GPU serving",
    "dev_first_stage": "the first stage the dev claims are reranked from, the one test reranks (model choice)",
    "dev_depth": "first-stage candidates per dev claim",
    "dev_encoder": "bi-encoder of the dev first stage's dense part (default: the default encoder)",
    "teacher": "margin_mse/listwise_kl: the first stage whose fused scores are distilled (top --dev-depth, cached)",
    "teacher_encoder": "bi-encoder of the teacher's dense part (default: the default encoder)",
    "candidates_per_query": "margin_mse/listwise_kl: best unjudged first-stage candidates per train claim",
    "label_weight": "margin_mse/listwise_kl: weight w of the label loss, (1 - w) * distillation + w * labels",
    "teacher_temperature": "margin_mse/listwise_kl: teacher scores divided by T (default: 1 for margin_mse, "
    "0.25 for listwise_kl)",
    "cpu_bf16": "true: bf16 autocast of the training steps on a CPU (CUDA trains in bf16 anyway)",
    "max_seconds": "end training at the first step past this many seconds (evaluated and saved; not in the recipe)",
}


def _bool(text: str) -> bool:
    """``true``/``false`` (also 1/0, yes/no) as a bool; anything else is a usage error."""
    import argparse

    value = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


@command
def main(argv: list[str]) -> int:
    """Parse ``argv``, train, export; returns the exit status (2 on a usage error)."""
    from training.reranker import RerankerConfig

    p = parser("train-reranker", __doc__)
    for f in dataclasses.fields(RerankerConfig):
        if f.name in ("resume", "models_dir"):
            continue
        flag = "--model" if f.name == "model_dir" else "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float, "bool": _bool}.get(str(f.type).split(" ")[0], str)
        choices = {
            "quantize": ["int8"],
            "dtype": ["fp16"],
            "loss": ["bce", "mnrl", "lambda", "margin_mse", "listwise_kl"],  # int8: also publish <name>-int8
            "negatives": ["bm25", "dense", "bm25+dense"],
            "dev_first_stage": ["dense", "bm25", "rrf", "dbsf"],
            "teacher": ["dense", "bm25", "rrf", "dbsf"],
        }.get(f.name)
        help_ = f"{HELP[f.name]} (default: {f.default})"
        p.add_argument(flag, dest=f.name, type=kind, default=f.default, choices=choices, help=help_)
    p.add_argument("--no-resume", dest="resume", action="store_false", help="retrain from scratch")
    p.add_argument("--publish", dest="models_dir", metavar="MODELS_DIR", help="export the chosen model there")
    cfg = RerankerConfig(**vars(p.parse_args(argv)))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from training.reranker import train_reranker

    print_json(train_reranker(cfg))
    return 0
