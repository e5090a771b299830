"""Export an encoder to a servable ONNX artifact (``python -m training export``).

Produces ``model.onnx`` + tokenizer files + ``manifest.json`` following the
contract in ``models/README.md`` / :mod:`artifact_contract`:

* :mod:`training.export.graph` — the graph: dynamic ``batch`` and ``seq`` axes on ``input_ids`` /
  ``attention_mask`` (int64); pooling inside it (:class:`PooledEncoder`), output ``sentence_embedding``
  ``(batch, dim)`` un-normalised (normalisation is :func:`artifact_contract.postprocess`, applied by consumers);
* :mod:`training.export.artifact` — export + parity against the torch model on real sentences (STS-B dev):
  fp32 must reach max |diff| <= 1e-4 and per-sentence cosine >= 0.9999, else :class:`ExportError` and no
  manifest is written;
* :mod:`training.export.quantize` — ``--quantize int8``: ONNX Runtime dynamic quantisation (int8 weights,
  MatMul/Gemm); ``--dtype fp16``: float16 for GPU serving (normalisations and pooling kept float32), held to
  min cosine >= 0.999 and STS-B dev within 0.1 of fp32; both record STS-B dev Spearman beside the fp32 one;
* :mod:`training.export.parity` — parity sentences and figures, the canary, the manifest (written last, so a
  half-written directory is never an artifact).

The command line is :mod:`training.cli.export`.
"""

from training.export.artifact import ArtifactSpec, export_artifact, export_module
from training.export.graph import PooledEncoder
from training.export.parity import ExportError
from training.export.quantize import fp16_artifact, quantize_artifact
from training.st_dir import default_model_dir

__all__ = [
    "ArtifactSpec",
    "ExportError",
    "PooledEncoder",
    "default_model_dir",
    "export_artifact",
    "export_module",
    "fp16_artifact",
    "quantize_artifact",
]
