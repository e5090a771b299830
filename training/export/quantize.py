"""Artifacts derived from an fp32 artifact: int8 dynamic quantisation.

Each conversion copies the fp32 artifact's tokenizer files, writes a converted ``model.onnx``, measures parity
against the fp32 graph on the parity sentences and STS-B dev Spearman of the converted graph (recorded beside the
fp32 one as ``STSBenchmark-dev-fp32``), and writes the manifest last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from artifact_contract import MODEL_FILE, Manifest, load_manifest
from training.export.parity import measure_parity, parity_sentences, stsb_dev, write_artifact_manifest
from training.onnx_encoder import OnnxArtifactEncoder

#: manifest fields a derived artifact does not take over from its fp32 source
_REDONE = {"created_at", "sha256", "scores", "parity", "canary", "files"}


def derive_artifact(
    src_dir: str | Path,
    output_dir: str | Path,
    *,
    name: str,
    version: str,
    convert: Callable[[Path, Path], None],
    label: str,
    fields: dict,
) -> Manifest:
    """Write the artifact ``convert(src/model.onnx, tmp)`` makes from the fp32 artifact in ``src_dir``.

    Args:
        convert: writes the converted graph to its second argument.
        label: what the parity compares (recorded in ``parity.source``).
        fields: manifest fields that differ from the source's (``quantization``, ...).

    Returns:
        The written manifest: parity against the fp32 graph (informational), ``STSBenchmark-dev`` of the converted
        graph and ``STSBenchmark-dev-fp32``.
    """
    src, out = Path(src_dir), Path(output_dir)
    fp32 = load_manifest(src)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in (MODEL_FILE, "manifest.json") and not f.name.startswith("."):
            shutil.copy2(f, out / f.name)
    tmp = out / f".{MODEL_FILE}.tmp"
    convert(src / MODEL_FILE, tmp)
    os.replace(tmp, out / MODEL_FILE)

    sents, source = parity_sentences()
    ref_enc, q_enc = OnnxArtifactEncoder(src), OnnxArtifactEncoder(out, max_seq_length=fp32.max_seq_length)
    parity = measure_parity(ref_enc.pooled(sents), q_enc.pooled(sents), f"{source}, {label}")
    dev_fp32 = fp32.scores["STSBenchmark-dev"] if "STSBenchmark-dev" in fp32.scores else stsb_dev(ref_enc)
    scores = {"STSBenchmark-dev": stsb_dev(q_enc), "STSBenchmark-dev-fp32": dev_fp32}
    kept = fp32.model_dump(exclude=_REDONE)
    return write_artifact_manifest(
        out, {**kept, "name": name, "version": version, **fields}, q_enc, parity=parity, scores=scores
    )


def _quantize_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)


def quantize_artifact(src_dir: str | Path, output_dir: str | Path, *, name: str, version: str = "1") -> Manifest:
    """Dynamically quantise an fp32 artifact to int8 (ONNX Runtime ``quantize_dynamic``, QInt8 weights).

    Records STS-B dev Spearman of the int8 graph (``STSBenchmark-dev``) beside the
    fp32 one (``STSBenchmark-dev-fp32``), and parity figures against the fp32 graph
    (informational: int8 is not held to the fp32 tolerance).
    """
    return derive_artifact(
        src_dir,
        output_dir,
        name=name,
        version=version,
        convert=_quantize_int8,
        label="int8 vs fp32 ONNX",
        fields={"quantization": "int8"},
    )


#: ``export_artifact(quantize=...)``: the conversion for each value
QUANTIZERS: dict[str, Callable[..., Manifest]] = {"int8": quantize_artifact}
