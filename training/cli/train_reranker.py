"""``python -m training train-reranker [--output-dir DIR] [--model DIR] [--max-steps N] [--publish MODELS_DIR] ...``.

Trains a cross-encoder reranker on BEIR SciFact's train qrels with BM25 hard negatives (sentence-transformers'
``CrossEncoderTrainer``, binary cross-entropy; :mod:`training.reranker`), choosing the checkpoint on a dev split
carved from train by query, and with ``--publish`` exports it as the next version of ``--artifact-name`` in
``MODELS_DIR`` (an artifact with ``task: "reranker"``, served by ``/rerank``, ``/v1/rerank`` and ``/v2/rerank`` once
loaded: ``--rerank-models NAME`` or ``POST /admin/models/NAME/load``). A finished run of the same recipe is not
trained again, an interrupted one resumes from its newest checkpoint (``--no-resume``: start over). ``--quantize int8``
also publishes ``<artifact-name>-int8``, the fp32 artifact dynamically quantised (ONNX Runtime, QInt8 weights).

A short CPU run::

    python -m training train-reranker --output-dir runs/rr-smoke --max-steps 20 --max-queries 40 --publish models/
"""

from __future__ import annotations

import dataclasses
import logging

from training.cli.common import command, parser, print_json


@command
def main(argv: list[str]) -> int:
    """Parse ``argv``, train, export; returns the exit status (2 on a usage error)."""
    from training.reranker import RerankerConfig

    p = parser("train-reranker", __doc__)
    for f in dataclasses.fields(RerankerConfig):
        if f.name in ("resume", "models_dir"):
            continue
        flag = "--model" if f.name == "model_dir" else "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        choices = ["int8"] if f.name == "quantize" else None  # int8: also publish <artifact-name>-int8
        p.add_argument(flag, dest=f.name, type=kind, default=f.default, choices=choices, help=f"default: {f.default}")
    p.add_argument("--no-resume", dest="resume", action="store_false", help="retrain from scratch")
    p.add_argument("--publish", dest="models_dir", metavar="MODELS_DIR", help="export the chosen model there")
    cfg = RerankerConfig(**vars(p.parse_args(argv)))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from training.reranker import train_reranker

    print_json(train_reranker(cfg))
    return 0
