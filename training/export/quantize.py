"""Artifacts derived from an fp32 artifact: int8 dynamic quantisation, fp16, and ONNX Runtime's fused graph.

Each conversion copies the fp32 artifact's tokenizer files, writes a converted ``model.onnx``, measures parity
against the fp32 graph on the parity sentences and STS-B dev Spearman of the converted graph (recorded beside the
fp32 one as ``STSBenchmark-dev-fp32``), both with ONNX Runtime on the CPU, and writes the manifest last.

* int8 (:func:`quantize_artifact`): ONNX Runtime ``quantize_dynamic``; its parity is informational.
* fp16 (:func:`fp16_artifact`): ONNX Runtime's float16 converter, with the precision-sensitive ops
  (:data:`FP32_OPS`: LayerNormalization, Softmax, ...) and the pooling after the encoder's last
  LayerNormalization kept in float32 and the graph's inputs/outputs unchanged (int64 in, float32 out). It must
  reach min cosine >= :data:`FP16_MIN_COS` and |STS-B dev - fp32's| <= :data:`FP16_MAX_DEV_DIFF`, else
  :class:`~training.export.parity.ExportError` and no manifest. ONNX Runtime's CPU provider runs the fp16 ops it
  has no fp16 kernel for in float32 (it inserts casts), so these figures are not a measurement of fp16
  arithmetic on a GPU, which was not measured.
* fused (:func:`fused_artifact`, fp32 or fp16): ONNX Runtime's transformer optimizer (``model_type="bert"``) rewrites
  each encoder layer into its fused com.microsoft ops (Attention, SkipLayerNormalization, BiasGelu, and one
  EmbedLayerNormalization), the kernels ONNX Runtime's CUDA provider has for BERT-style encoders (ONNX Runtime docs,
  "Transformer Model Optimization Tool"); the attention keeps the raw 2-D ``attention_mask`` (``FusionOptions
  .use_raw_attention_mask``), so any mask means what it means in the unfused graph (the default mask-index form
  assumes right padding and answers differently for a left-padded row). Every layer must fuse, else
  :class:`~training.export.parity.ExportError`; fp32 is held to the export tolerance against the unfused graph, fp16
  to the fp16 one. The graph then runs on ONNX Runtime only (the manifest's ``fusion``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

from artifact_contract import MODEL_FILE, Canary, Manifest, Parity, load_manifest
from training.export.parity import (
    ExportError,
    fp32_parity_failure,
    measure_parity,
    parity_sentences,
    stsb_dev,
    write_artifact_manifest,
)
from training.onnx_encoder import OnnxArtifactEncoder

#: fp16 acceptance against the fp32 graph: min per-sentence cosine, max |STS-B dev Spearman x100 difference|
FP16_MIN_COS = 0.999
FP16_MAX_DEV_DIFF = 0.1
#: canary tolerance of fp16 artifacts: fp16 arithmetic differs between execution providers (the canary is
#: recorded on the CPU, the artifact is served on a GPU)
FP16_CANARY_ATOL = 5e-3
#: op types kept in float32, besides ONNX Runtime's default block list: normalisations (variance and exp lose
#: precision or overflow in fp16) and the reductions and powers they decompose into at older opsets
FP32_OPS = ("LayerNormalization", "SkipLayerNormalization", "Softmax", "ReduceMean", "ReduceSum", "Pow", "Sqrt")

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
    accept: Callable[[Parity, dict[str, float]], str | None] = lambda parity, scores: None,
    canary_atol: float = Canary.model_fields["atol"].default,
) -> Manifest:
    """Write the artifact ``convert(src/model.onnx, tmp)`` makes from the fp32 artifact in ``src_dir``.

    Args:
        convert: writes the converted graph to its second argument.
        label: what the parity compares (recorded in ``parity.source``).
        fields: manifest fields that differ from the source's (``quantization``, ``dtype``).
        accept: ``accept(parity, scores)`` returns why the converted graph is rejected, or None.
        canary_atol: the canary tolerance recorded for loaders.

    Returns:
        The written manifest: parity against the fp32 graph, ``STSBenchmark-dev`` of the converted
        graph and ``STSBenchmark-dev-fp32``.

    Raises:
        ExportError: ``accept`` rejected the graph (its ``model.onnx`` is removed; no manifest is written), or ONNX
            Runtime cannot run it on the CPU.
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
    ref_enc = OnnxArtifactEncoder(src)
    try:
        q_enc = OnnxArtifactEncoder(out, max_seq_length=fp32.max_seq_length)
    except Exception as e:  # onnxruntime's own error types: a graph the CPU provider cannot run
        (out / MODEL_FILE).unlink()
        raise ExportError(f"ONNX Runtime cannot run the {label} graph on the CPU: {e}") from e
    parity = measure_parity(ref_enc.pooled(sents), q_enc.pooled(sents), f"{source}, {label}", q_enc.provider)
    dev_fp32 = fp32.scores["STSBenchmark-dev"] if "STSBenchmark-dev" in fp32.scores else stsb_dev(ref_enc)
    scores = {"STSBenchmark-dev": stsb_dev(q_enc), "STSBenchmark-dev-fp32": dev_fp32}
    why = accept(parity, scores)
    if why is not None:
        (out / MODEL_FILE).unlink()
        raise ExportError(f"{label} export rejected: {why}")
    kept = fp32.model_dump(exclude=_REDONE)
    fields = {**kept, "name": name, "version": version, **fields}
    return write_artifact_manifest(out, fields, q_enc, parity=parity, scores=scores, canary_atol=canary_atol)


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


def pooling_nodes(model) -> list[str]:
    """Names of the nodes downstream of the encoder's last ``LayerNormalization`` (or fused
    ``SkipLayerNormalization``; its last hidden state): the pooling and any head kept at inference, which the fp16
    conversion keeps in float32.

    Raises:
        ExportError: the graph has no LayerNormalization node.
    """
    norms = [n for n in model.graph.node if n.op_type in ("LayerNormalization", "SkipLayerNormalization")]
    if not norms:
        raise ExportError("no LayerNormalization node: cannot tell the encoder from the pooling")
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    names: list[str] = []
    todo = list(norms[-1].output)
    while todo:
        for n in consumers.get(todo.pop(), []):
            if n.name not in names:
                names.append(n.name)
                todo.extend(n.output)
    return names


def _fp16_options(model) -> dict:
    """``convert_float_to_float16`` keywords for ``model`` (an ``onnx.ModelProto``): :data:`FP32_OPS`, the pooling and
    the graph's inputs/outputs kept in float32."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

    return {
        "keep_io_types": True,
        "op_block_list": [*DEFAULT_OP_BLOCK_LIST, *FP32_OPS],
        "node_block_list": pooling_nodes(model),
    }


def convert_fp16(src: Path, dst: Path) -> None:
    """Write ``src``'s graph in float16 to ``dst`` (module docstring: :data:`FP32_OPS`, the pooling or head after the
    last LayerNormalization, and the graph's inputs/outputs kept in float32)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    onnx.save(convert_float_to_float16(model, **_fp16_options(model)), str(dst))


def _fp16_acceptable(parity: Parity, scores: dict[str, float]) -> str | None:
    diff = abs(scores["STSBenchmark-dev"] - scores["STSBenchmark-dev-fp32"])
    if parity.min_cosine < FP16_MIN_COS or diff > FP16_MAX_DEV_DIFF:
        return (
            f"min cosine {parity.min_cosine:.6f} (limit {FP16_MIN_COS}), STS-B dev differs from fp32 by {diff:.3f} "
            f"(limit {FP16_MAX_DEV_DIFF})"
        )
    return None


def fp16_artifact(src_dir: str | Path, output_dir: str | Path, *, name: str, version: str = "1") -> Manifest:
    """Convert an fp32 artifact to fp16 for GPU serving (module docstring); the manifest says ``dtype: fp16``.

    Raises:
        ExportError: min cosine against the fp32 graph below :data:`FP16_MIN_COS`, or STS-B dev Spearman more than
            :data:`FP16_MAX_DEV_DIFF` away from fp32's (no manifest is written).
    """
    return derive_artifact(
        src_dir,
        output_dir,
        name=name,
        version=version,
        convert=convert_fp16,
        label="fp16 vs fp32 ONNX, both on ONNX Runtime's CPU provider, which runs fp16 ops it has no fp16 kernel "
        "for in float32 (GPU not measured)",
        fields={"dtype": "fp16"},
        accept=_fp16_acceptable,
        canary_atol=FP16_CANARY_ATOL,
    )


def _fuse(src: Path, dst: Path, *, num_heads: int, hidden_size: int, num_layers: int, dtype: str) -> None:
    """ONNX Runtime's transformer optimizer on ``src`` (module docstring), then float16 when ``dtype`` is fp16.

    Raises:
        ExportError: fewer than ``num_layers`` Attention or ``2 * num_layers`` SkipLayerNormalization nodes fused
            (an encoder the optimizer does not recognise).
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.use_raw_attention_mask(True)
    opt = optimize_model(
        str(src),
        model_type="bert",
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=0,
        use_gpu=True,
        optimization_options=options,
    )
    fused = opt.get_fused_operator_statistics()
    if fused.get("Attention", 0) < num_layers or fused.get("SkipLayerNormalization", 0) < 2 * num_layers:
        raise ExportError(
            f"ONNX Runtime's transformer optimizer fused {fused.get('Attention', 0)} Attention and "
            f"{fused.get('SkipLayerNormalization', 0)} SkipLayerNormalization nodes, want {num_layers} and "
            f"{2 * num_layers} ({num_layers} layers, {num_heads} heads, hidden size {hidden_size})"
        )
    if dtype == "fp16":  # the optimizer's own converter: its shape inference knows the com.microsoft ops
        opt.convert_float_to_float16(**_fp16_options(opt.model))
    opt.save_model_to_file(str(dst))


def fused_artifact(
    src_dir: str | Path,
    output_dir: str | Path,
    *,
    name: str,
    version: str = "1",
    num_heads: int,
    hidden_size: int,
    num_layers: int,
    dtype: str = "fp32",
) -> Manifest:
    """The fp32 artifact in ``src_dir`` with ONNX Runtime's fused encoder layers (module docstring), fp32 or fp16.

    Args:
        num_heads, hidden_size, num_layers: the encoder's (its Hugging Face config's ``num_attention_heads``,
            ``hidden_size``, ``num_hidden_layers``); the optimizer cannot read them from this graph.
        dtype: ``fp32`` or ``fp16`` (then converted as :func:`fp16_artifact` does, after the fusion).

    Returns:
        The manifest: ``fusion: onnxruntime-bert``, parity against the unfused fp32 graph.

    Raises:
        ExportError: not every layer fused; parity against the unfused fp32 graph outside the export tolerance (fp32:
            max abs diff <= 1e-4, cosine >= 0.9999) or the fp16 one (no manifest is written).
    """
    if dtype not in ("fp32", "fp16"):
        raise ExportError(f"dtype must be fp32 or fp16, got {dtype!r}")
    fp16 = dtype == "fp16"
    return derive_artifact(
        src_dir,
        output_dir,
        name=name,
        version=version,
        convert=partial(_fuse, num_heads=num_heads, hidden_size=hidden_size, num_layers=num_layers, dtype=dtype),
        label=f"ONNX Runtime fused {dtype} vs unfused fp32 ONNX, both on ONNX Runtime's CPU provider"
        + (", which runs fp16 ops it has no fp16 kernel for in float32 (GPU not measured)" if fp16 else ""),
        fields={"dtype": dtype, "fusion": "onnxruntime-bert"},
        accept=_fp16_acceptable if fp16 else lambda parity, scores: fp32_parity_failure(parity),
        canary_atol=FP16_CANARY_ATOL if fp16 else Canary.model_fields["atol"].default,
    )


#: ``export_artifact``: the conversion for each ``quantize`` / ``dtype`` value other than fp32
CONVERSIONS: dict[str, Callable[..., Manifest]] = {"int8": quantize_artifact, "fp16": fp16_artifact}
