"""ONNX Runtime's fused graph of the real default encoder (all-MiniLM-L6-v2), fp16: every layer fused, parity against
the unfused fp32 graph recorded and held, the contract's inputs/output and the attention mask's meaning unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from artifact_contract import INPUT_NAMES, MODEL_FILE, OUTPUT_NAME, load_manifest, validate_artifact
from training.export import ExportError
from training.export.quantize import fused_artifact

pytestmark = pytest.mark.timeout(900)

MINILM = {"num_heads": 12, "hidden_size": 384, "num_layers": 6}  # the default encoder's config.json


def test_manifest_records_fusion_and_parity_against_unfused_fp32(fused_fp16_artifact, default_artifact):
    m = validate_artifact(fused_fp16_artifact)
    fp32 = load_manifest(default_artifact)
    assert (m.dtype, m.fusion, m.quantization, m.dimension, m.pooling) == (
        "fp16",
        "onnxruntime-bert",
        None,
        384,
        "mean",
    )
    assert m.parity.n_sentences >= 200 and "fused fp16 vs unfused fp32" in m.parity.source
    assert m.parity.min_cosine >= 0.999
    assert m.scores["STSBenchmark-dev-fp32"] == pytest.approx(fp32.scores["STSBenchmark-dev"], abs=1e-6)
    assert abs(m.scores["STSBenchmark-dev"] - m.scores["STSBenchmark-dev-fp32"]) <= 0.1
    assert m.canary.atol == 5e-3


def test_every_layer_fused_and_contract_io_kept(fused_fp16_artifact):
    import onnx
    from onnx import TensorProto

    g = onnx.load(str(fused_fp16_artifact / MODEL_FILE)).graph
    ops = [n.op_type for n in g.node]
    counts = {op: ops.count(op) for op in ("Attention", "SkipLayerNormalization", "EmbedLayerNormalization")}
    assert counts == {"Attention": 6, "SkipLayerNormalization": 12, "EmbedLayerNormalization": 1}
    assert "LayerNormalization" not in ops and "Softmax" not in ops  # inside the fused ops now
    assert [(i.name, i.type.tensor_type.elem_type) for i in g.input] == [(n, TensorProto.INT64) for n in INPUT_NAMES]
    assert [(o.name, o.type.tensor_type.elem_type) for o in g.output] == [(OUTPUT_NAME, TensorProto.FLOAT)]
    weights = {t.name: t.data_type for t in g.initializer}
    qkv = [n.input[1] for n in g.node if n.op_type == "Attention"]
    assert all(weights[w] == TensorProto.FLOAT16 for w in qkv)  # the attention projections in float16


def test_attention_mask_keeps_its_meaning(fused_fp16_artifact, default_artifact):
    """Left padding and a hole in the mask answer as in the unfused graph (a mask-index fusion assumes right
    padding and would not)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    ids = rng.integers(2000, 20000, (4, 24)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = np.ones_like(ids)
    mask[1, 16:] = 0  # right padding
    mask[2, :6] = 0  # left padding
    mask[3, 8:12] = 0  # a hole
    feeds = {"input_ids": ids, "attention_mask": mask}
    ref = ort.InferenceSession(str(default_artifact / MODEL_FILE), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(fused_fp16_artifact / MODEL_FILE), providers=["CPUExecutionProvider"])
    a, b = ref.run([OUTPUT_NAME], feeds)[0], got.run([OUTPUT_NAME], feeds)[0]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.min() >= 0.999, cos


def test_an_encoder_that_does_not_fully_fuse_is_refused(default_artifact, tmp_path):
    with pytest.raises(ExportError, match="fused 6 Attention .* want 7"):
        fused_artifact(default_artifact, tmp_path / "x", name="x", **{**MINILM, "num_layers": 7})
    assert not (tmp_path / "x" / "manifest.json").exists() and not (tmp_path / "x" / MODEL_FILE).exists()


def test_fuse_does_not_go_with_int8(default_model_dir):
    from training.cli.export import main
    from training.export import export_artifact

    with pytest.raises(ExportError, match="fuse applies to fp32 and fp16"):
        export_artifact(default_model_dir, "unused", name="x", quantize="int8", fuse=True)
    assert main(["--output", "unused", "--quantize", "int8", "--fuse"]) == 2
    assert not Path("unused").exists()
