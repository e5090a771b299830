"""Reranker artifacts derived from an fp32 one (:mod:`training.export.reranker`): the int8 twin for CPU serving
(:func:`quantize_reranker`) and the fp16 twin for GPU serving (:func:`fp16_reranker`), as
:mod:`training.export.quantize` derives encoder artifacts: the tokenizer files copied, the graph converted, its raw
scores compared with the fp32 graph's on held-out pairs (both on ONNX Runtime's CPU provider), the canary re-scored
by the converted graph, the manifest written last (a half-written directory is never an artifact); and
:func:`export_local_reranker`, the ``python -m training export-reranker`` export of a local cross-encoder (fp32, or
one of the twins made from the fp32 export).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from artifact_contract import MODEL_FILE, Manifest, Parity, now_utc, sha256_file, write_manifest
from training.export.parity import ExportError
from training.export.reranker import CANARY_PAIRS, export_reranker, local_parity_pairs, onnx_pair_scores

#: fp16 acceptance: max |raw score - the fp32 graph's| on the parity pairs (a sigmoid score moves by at most a
#: quarter of it); and the canary tolerance of fp16 rerankers (recorded on the CPU, served on a GPU)
RERANK_FP16_MAX_ABS = 0.05
RERANK_FP16_CANARY_ATOL = 0.05


def derive_reranker(
    src_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    name: str,
    version: str,
    convert: Callable[[Path, Path], None],
    label: str,
    fields: dict,
    parity_pairs: Sequence[tuple[str, str]] | None = None,
    parity_source: str = "built-in canary pairs",
    max_abs: float | None = None,
    canary_atol: float | None = None,
) -> Manifest:
    """The reranker artifact ``convert(src/model.onnx, tmp)`` makes from the fp32 one in ``src_dir``: the tokenizer
    files copied, the canary re-scored by the converted graph, parity against the fp32 graph's raw scores on
    ``parity_pairs`` recorded (both on ONNX Runtime's CPU provider), the manifest written last.

    Args:
        label: what the parity compares (recorded in ``parity.source``).
        fields: manifest fields that differ from the source's (``quantization``, ``dtype``).
        max_abs: refuse the graph when its parity is over this (None: informational).
        canary_atol: the canary tolerance recorded for loaders (None: the fp32 artifact's).

    Returns:
        The written manifest (the fp32 manifest's ``training``, ``scores`` and ``activation``).

    Raises:
        artifact_contract.ArtifactError: ``src_dir`` is not a valid fp32 reranker artifact.
        ExportError: parity over ``max_abs`` (the converted ``model.onnx`` is removed, no manifest is written).
    """
    import shutil

    from artifact_contract import ArtifactError, validate_artifact

    src, out = Path(src_dir), Path(output_dir)
    fp32 = validate_artifact(src)
    if not fp32.is_reranker or fp32.quantization is not None or fp32.dtype != "fp32":
        raise ArtifactError(f"{src}: not an fp32 reranker artifact")
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    for f in fp32.files:
        if f != MODEL_FILE:
            shutil.copy2(src / f, out / f)
    convert(src / MODEL_FILE, out / MODEL_FILE)
    pairs = list(parity_pairs or CANARY_PAIRS)
    diff = float(np.abs(onnx_pair_scores(src, pairs) - onnx_pair_scores(out, pairs)).max())
    if max_abs is not None and not diff <= max_abs:
        (out / MODEL_FILE).unlink()
        raise ExportError(f"{label}: max |score diff| {diff:.3g} over {max_abs}; no artifact written")
    canary = onnx_pair_scores(out, CANARY_PAIRS)
    atol = fp32.canary.atol if canary_atol is None else canary_atol
    manifest = fp32.model_copy(
        update={
            "name": name,
            "version": version,
            "created_at": now_utc(),
            **fields,
            "sha256": sha256_file(out / MODEL_FILE),
            "parity": Parity(
                n_sentences=len(pairs),
                max_abs_diff=diff,
                provider="CPUExecutionProvider",
                source=f"{parity_source}: raw scores, {label}",
            ),
            "canary": fp32.canary.model_copy(update={"embeddings": [[float(s)] for s in canary], "atol": atol}),
            "files": sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")),
        }
    )
    write_manifest(out, Manifest.model_validate(manifest.model_dump()))
    return manifest


def _quantize_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


def quantize_reranker(
    src_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    name: str,
    version: str = "1",
    parity_pairs: Sequence[tuple[str, str]] | None = None,
    parity_source: str = "built-in canary pairs",
) -> Manifest:
    """An int8 reranker artifact from the fp32 one in ``src_dir``: ONNX Runtime ``quantize_dynamic`` (QInt8 weights,
    as :func:`training.export.quantize.quantize_artifact` does for encoders), parity against the fp32 graph's raw
    scores on ``parity_pairs`` recorded (informational: int8 is not held to the fp32 tolerance).

    Returns:
        The written manifest (``quantization: "int8"``; the fp32 manifest's ``training`` and ``scores``).

    Raises:
        artifact_contract.ArtifactError: ``src_dir`` is not a valid fp32 reranker artifact.
    """
    return derive_reranker(
        src_dir,
        output_dir,
        name=name,
        version=version,
        convert=_quantize_int8,
        label="int8 vs fp32 ONNX (informational)",
        fields={"quantization": "int8"},
        parity_pairs=parity_pairs,
        parity_source=parity_source,
    )


def fp16_reranker(
    src_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    name: str,
    version: str = "1",
    parity_pairs: Sequence[tuple[str, str]] | None = None,
    parity_source: str = "built-in canary pairs",
) -> Manifest:
    """An fp16 reranker artifact (``dtype: "fp16"``) from the fp32 one in ``src_dir``, for GPU serving: converted as
    :func:`training.export.quantize.fp16_artifact` converts encoders (ONNX Runtime's float16 converter; int64 inputs
    and float32 ``logits`` kept, normalisations and the classification head after the last LayerNormalization in
    float32); the service refuses it on the CPU (``PrecisionUnsupported``). Parity against the fp32 graph's raw
    scores, both on ONNX Runtime's CPU provider (which runs the fp16 ops it has no fp16 kernel for in float32: not
    a measurement of fp16 arithmetic on a GPU), must be within :data:`RERANK_FP16_MAX_ABS`; the canary is held to
    :data:`RERANK_FP16_CANARY_ATOL`.

    Returns:
        The written manifest (``dtype: "fp16"``; the fp32 manifest's ``training``, ``scores`` and ``activation``).

    Raises:
        ExportError: parity over :data:`RERANK_FP16_MAX_ABS` (no artifact written).
        artifact_contract.ArtifactError: ``src_dir`` is not a valid fp32 reranker artifact.
    """
    from training.export.quantize import convert_fp16

    label = (
        "fp16 vs fp32 ONNX, both on ONNX Runtime's CPU provider, which runs fp16 ops it has no fp16 kernel for in "
        "float32 (GPU not measured)"
    )
    return derive_reranker(
        src_dir,
        output_dir,
        name=name,
        version=version,
        convert=convert_fp16,
        label=label,
        fields={"dtype": "fp16"},
        parity_pairs=parity_pairs,
        parity_source=parity_source,
        max_abs=RERANK_FP16_MAX_ABS,
        canary_atol=RERANK_FP16_CANARY_ATOL,
    )


def export_local_reranker(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    name: str,
    version: str = "1",
    quantize: str | None = None,
    dtype: str = "fp32",
) -> Manifest:
    """Export a cross-encoder from a local directory as it is, without training (``python -m training
    export-reranker``): :func:`~training.export.reranker.export_reranker` with parity on
    :func:`~training.export.reranker.local_parity_pairs`; with
    ``quantize="int8"`` or ``dtype="fp16"`` (exclusive), the fp32 artifact is made in a temporary directory and
    ``output_dir`` receives its int8 (:func:`quantize_reranker`) or fp16 (:func:`fp16_reranker`) twin, with parity
    against the fp32 graph.

    Raises:
        ExportError: as :func:`~training.export.reranker.export_reranker` and :func:`fp16_reranker`, a quantization other than int8, a dtype
            other than fp32 or fp16, or both int8 and fp16.
    """
    import tempfile

    if quantize not in (None, "int8") or dtype not in ("fp32", "fp16"):
        raise ExportError(f"unsupported quantization {quantize!r} or dtype {dtype!r} (int8; fp32 or fp16)")
    if quantize is not None and dtype != "fp32":
        raise ExportError(f"quantization {quantize} applies to fp32 graphs, not dtype {dtype}")
    pairs, source = local_parity_pairs()
    if quantize is None and dtype == "fp32":
        return export_reranker(
            model_dir, output_dir, name=name, version=version, parity_pairs=pairs, parity_source=source
        )
    derive = quantize_reranker if quantize else fp16_reranker
    with tempfile.TemporaryDirectory(prefix="fp32-reranker-") as tmp:
        export_reranker(model_dir, tmp, name=name, version=version, parity_pairs=pairs, parity_source=source)
        return derive(tmp, output_dir, name=name, version=version, parity_pairs=pairs, parity_source=source)
