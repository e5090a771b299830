"""``python -m training export-reranker --model DIR [--out DIR] [--name NAME] [--version V] [--quantize int8 | --dtype
fp16]``.

Exports a cross-encoder from a local directory as it is, without training: a sentence-transformers ``CrossEncoder``
directory (``CrossEncoder.save``) or any Hugging Face sequence-classification directory with one label (an ms-marco
MiniLM, a bge-reranker, ...). Writes a reranker artifact (``task: "reranker"``: ``model.onnx`` answering one raw
score per (query, passage) pair, tokenizer files, ``manifest.json``; models/README.md "Reranker artifacts"), its
parity against ``CrossEncoder.predict`` on real SciFact pairs recorded (fp32: at most 1e-4, else no artifact) and the
CrossEncoder's activation (sigmoid or identity) in the manifest's ``activation``. ``--quantize int8`` writes the int8
twin instead (ONNX Runtime dynamic quantisation; parity against the fp32 graph, informational); ``--dtype fp16`` the
fp16 twin for GPU serving (float16 arithmetic, int64 in and float32 scores out; parity against the fp32 graph within
0.05 raw score, else no artifact; the service refuses it on a CPU). Serve it with
``python -m service --rerank-models NAME`` (or ``POST /admin/models/NAME/load``) from the models directory it is in.
"""

from __future__ import annotations

import re
from pathlib import Path

from training.cli.common import command, parser, print_json


@command
def main(argv: list[str]) -> int:
    """Parse ``argv``, export, print a summary; returns the exit status (1 when the export fails)."""
    p = parser("export-reranker", __doc__)
    p.add_argument("--model", required=True, help="local CrossEncoder / Hugging Face sequence-classification dir")
    p.add_argument("--out", "--output", dest="out", default=None, help="artifact directory (default: models/NAME)")
    p.add_argument(
        "--name", default=None, help="artifact name (default: --out's folder name, else the model directory's)"
    )
    p.add_argument("--version", default="1")
    p.add_argument("--quantize", choices=["int8"], default=None, help="int8 dynamic quantisation (CPU serving)")
    p.add_argument(
        "--dtype",
        choices=["fp32", "fp16"],
        default="fp32",
        help="fp16: float16 weights and arithmetic for GPU serving (normalisations and the head stay float32)",
    )
    a = p.parse_args(argv)
    if a.quantize and a.dtype != "fp32":
        p.error("--quantize int8 does not go with --dtype fp16")
    model = Path(a.model)
    if not model.is_dir():
        p.error(f"--model {model}: not a directory")
    # the service names an artifact by its folder (models/NAME/): the name follows --out, else the model's folder
    source = Path(a.out).name if a.out else model.resolve().name
    name = a.name or re.sub(r"[^A-Za-z0-9._-]+", "-", source).strip("-._") or "reranker"
    out = Path(a.out) if a.out else Path("models") / name
    from training.export.parity import ExportError
    from training.export.reranker_twins import export_local_reranker

    try:
        m = export_local_reranker(model, out, name=name, version=a.version, quantize=a.quantize, dtype=a.dtype)
    except ExportError as e:
        print(f"export failed: {e}", flush=True)
        return 1
    summary = {"artifact": str(out), "name": m.name, "version": m.version, "task": m.task}
    summary.update(activation=m.activation, quantization=m.quantization, dtype=m.dtype, max_seq_length=m.max_seq_length)
    summary.update(sha256=m.sha256, parity=m.parity.model_dump() if m.parity else None)
    print_json(summary)
    return 0
