"""Export and artifact contract: parity, dynamic axes, int8, and validation errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from artifact_contract import (
    ArtifactError,
    find_artifacts,
    load_manifest,
    postprocess,
    resolve_artifact,
    validate_artifact,
)
from training.data.sts import load_task
from training.onnx_encoder import OnnxArtifactEncoder


@pytest.fixture(scope="module")
def sick_sentences() -> list[str]:
    pairs = load_task("SICKRelatedness")
    return list(dict.fromkeys(pairs.sent1))[:200]


def test_manifest_records_fp32_parity(default_artifact: Path) -> None:
    m = validate_artifact(default_artifact)
    assert m.name == "all-minilm-l6-v2" and m.pooling == "mean" and m.normalize and m.dimension == 384
    assert m.training is None and m.quantization is None
    assert m.parity is not None and m.parity.n_sentences >= 200
    assert m.parity.max_abs_diff <= 1e-4 and m.parity.min_cosine >= 0.9999
    assert abs(m.scores["STSBenchmark-dev"] - 86.72) <= 0.05  # the reference (../shared/data/README.md)


def test_onnx_matches_sentence_transformers_on_unseen_sentences(default_artifact, default_model_dir, sick_sentences):
    """Independent parity: the artifact against sentence-transformers' own encode, on SICK sentences."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_model_dir), device="cpu")
    ref = st.encode(sick_sentences, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    got = OnnxArtifactEncoder(default_artifact).encode(sick_sentences, batch_size=17)
    assert got.shape == ref.shape == (len(sick_sentences), 384)
    assert np.abs(got - ref).max() <= 1e-4
    assert ((got * ref).sum(1)).min() >= 0.9999


def test_dynamic_batch_and_sequence_axes(default_artifact: Path) -> None:
    enc = OnnxArtifactEncoder(default_artifact)
    one = enc.encode(["Hi."], batch_size=1)
    long = "word " * 400  # truncated to max_seq_length
    many = enc.encode(["Hi.", long, "A man is slicing a tomato on a board."], batch_size=3)
    assert one.shape == (1, 384) and many.shape == (3, 384)
    np.testing.assert_allclose(one[0], many[0], atol=1e-5)  # padding does not leak into mean pooling


def test_int8_artifact(int8_artifact: Path, default_artifact: Path) -> None:
    m = validate_artifact(int8_artifact)
    fp32 = load_manifest(default_artifact)
    assert m.quantization == "int8"
    assert m.scores["STSBenchmark-dev-fp32"] == pytest.approx(fp32.scores["STSBenchmark-dev"])
    assert m.scores["STSBenchmark-dev"] > fp32.scores["STSBenchmark-dev"] - 1.0
    assert (int8_artifact / "model.onnx").stat().st_size < 0.4 * (default_artifact / "model.onnx").stat().st_size


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_validation_names_what_is_wrong(default_artifact: Path, tmp_path: Path) -> None:
    a = _copy(default_artifact, tmp_path / "models" / "bad")
    raw = json.loads((a / "manifest.json").read_text())
    raw["pooling"] = "max"
    raw.pop("dimension")
    (a / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ArtifactError, match=r"pooling.*dimension|dimension.*pooling"):
        load_manifest(a)

    b = _copy(default_artifact, tmp_path / "models" / "tampered")
    with open(b / "model.onnx", "r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(ArtifactError, match="sha256"):
        validate_artifact(b)

    c = _copy(default_artifact, tmp_path / "models" / "notok")
    (c / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer.json"):
        validate_artifact(c)


def test_resolve_flat_and_versioned(default_artifact: Path, tmp_path: Path) -> None:
    root = tmp_path / "models"
    _copy(default_artifact, root / "flat")
    for v in ("1", "2", "10"):
        _copy(default_artifact, root / "versioned" / v)
    names = {(r.name, r.version) for r in find_artifacts(root)}
    assert ("flat", "1") in names and ("versioned", "10") in names
    assert resolve_artifact(root, "versioned").version == "10"  # numeric, not lexical, order
    assert resolve_artifact(root, "versioned", "2").path == root / "versioned" / "2"
    with pytest.raises(ArtifactError, match="available"):
        resolve_artifact(root, "missing")


def test_postprocess_dimensions_renormalise() -> None:
    x = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    np.testing.assert_allclose(postprocess(x), x / 13.0, rtol=1e-6)
    np.testing.assert_allclose(postprocess(x, normalize=False), x)
    np.testing.assert_allclose(postprocess(x, dimensions=2), [[0.6, 0.8]], rtol=1e-6)
    with pytest.raises(ValueError):
        postprocess(x, dimensions=4)
