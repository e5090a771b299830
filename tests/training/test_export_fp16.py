"""fp16 export of the real default encoder (all-MiniLM-L6-v2): manifest parity against fp32 and its thresholds,
the graph's precision (normalisations and pooling in float32, the contract's inputs and output unchanged)."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifact_contract import INPUT_NAMES, MODEL_FILE, OUTPUT_NAME, load_manifest, validate_artifact
from training.onnx_encoder import OnnxArtifactEncoder

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def fp16_dir(fp16_artifact) -> Path:
    """``export_artifact(..., dtype="fp16")`` of the default encoder (the session's, exported once)."""
    return fp16_artifact


def test_manifest_records_parity_against_fp32_within_thresholds(fp16_dir, default_artifact):
    m = validate_artifact(fp16_dir)
    fp32 = load_manifest(default_artifact)
    assert (m.dtype, m.quantization, m.dimension, m.pooling) == ("fp16", None, 384, "mean")
    assert m.parity.n_sentences >= 200 and m.parity.source.startswith("STS-B dev")
    assert "GPU not measured" in m.parity.source and m.parity.provider == "CPUExecutionProvider"
    assert m.parity.min_cosine >= 0.999
    assert m.scores["STSBenchmark-dev-fp32"] == pytest.approx(fp32.scores["STSBenchmark-dev"], abs=1e-6)
    assert abs(m.scores["STSBenchmark-dev"] - m.scores["STSBenchmark-dev-fp32"]) <= 0.1
    assert m.canary.atol == 5e-3
    size = (fp16_dir / MODEL_FILE).stat().st_size
    assert size < 0.55 * (default_artifact / MODEL_FILE).stat().st_size  # float16 weights: half the bytes


def test_graph_keeps_contract_io_and_float32_normalisations(fp16_dir):
    import onnx
    from onnx import TensorProto

    model = onnx.shape_inference.infer_shapes(onnx.load(str(fp16_dir / MODEL_FILE)))
    g = model.graph
    assert [(i.name, i.type.tensor_type.elem_type) for i in g.input] == [(n, TensorProto.INT64) for n in INPUT_NAMES]
    assert [(o.name, o.type.tensor_type.elem_type) for o in g.output] == [(OUTPUT_NAME, TensorProto.FLOAT)]
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.value_info, *g.input, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    by_op: dict[str, list] = {}
    for n in g.node:
        by_op.setdefault(n.op_type, []).append(n)
    assert len(by_op["MatMul"]) == 48 and len(by_op["LayerNormalization"]) == 13 and len(by_op["Softmax"]) == 6
    for n in by_op["MatMul"]:  # the encoder's projections run in float16 ...
        assert types[n.input[0]] == types[n.input[1]] == TensorProto.FLOAT16, n.name
    # ... its normalisations and the mean pooling (two ReduceSum) in float32
    for n in by_op["LayerNormalization"] + by_op["Softmax"] + by_op["ReduceSum"]:
        assert types[n.input[0]] == TensorProto.FLOAT, (n.op_type, n.name)


def test_fp16_graph_matches_fp32_on_unseen_sentences(fp16_dir, default_artifact):
    from training.data.sts import load_task

    sick = list(dict.fromkeys(load_task("SICKRelatedness").sent1))[:200]
    ref = OnnxArtifactEncoder(default_artifact).encode(sick)
    got = OnnxArtifactEncoder(fp16_dir).encode(sick)
    assert ((ref * got).sum(1)).min() >= 0.999


def test_int8_and_fp16_are_exclusive(default_model_dir):
    from training.cli.export import main
    from training.export import ExportError, export_artifact

    with pytest.raises(ExportError, match="fp32 graphs"):
        export_artifact(default_model_dir, "unused", name="x", quantize="int8", dtype="fp16")
    assert main(["--output", "unused", "--quantize", "int8", "--dtype", "fp16"]) == 2
    assert not Path("unused").exists()
