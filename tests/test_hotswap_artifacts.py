"""Artifacts for the hot-swap tests (issue 6), built cheaply from the default ones, and checks of the builders.

* :func:`versioned_copy`: an existing artifact re-labelled ``models/<name>/<version>/``
  (model.onnx hard-linked when possible; manifest rewritten with the new name/version).
* :func:`sliced_artifact`: a genuinely different model — the source graph followed by an
  ONNX ``Slice`` keeping the first ``dim`` columns of ``sentence_embedding`` — with its
  own sha256 and a canary recorded from the new graph, so it loads like any export.
* :func:`corrupt_artifact` / :func:`wrong_dimension_artifact`: artifacts that must fail to load.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from artifact_contract import (
    MODEL_FILE,
    OUTPUT_NAME,
    Canary,
    load_manifest,
    sha256_file,
    validate_artifact,
    write_manifest,
)

NAME = "minilm"


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def versioned_copy(src: Path, models_dir: Path, name: str, version: str) -> Path:
    """``models_dir/name/version/``: the artifact at ``src`` under a new name and version. Returns its directory."""
    dst = Path(models_dir) / name / version
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and f.name != "manifest.json" and not f.name.startswith("."):
            (_link_or_copy if f.name == MODEL_FILE else shutil.copy2)(f, dst / f.name)
    m = load_manifest(src).model_copy(update={"name": name, "version": version})
    write_manifest(dst, m)
    return dst


def sliced_artifact(src: Path, models_dir: Path, name: str, version: str, dim: int) -> Path:
    """``models_dir/name/version/``: ``src``'s graph keeping only the first ``dim`` embedding columns.

    Served embeddings are the first ``dim`` pooled columns, L2-normalised; the manifest has
    ``dimension=dim``, the new sha256 and a canary recorded by running the new graph.
    """
    import onnx
    from onnx import TensorProto, helper

    from service.backend import OnnxModel

    dst = Path(models_dir) / name / version
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(src).iterdir():
        if f.is_file() and f.name not in ("manifest.json", MODEL_FILE) and not f.name.startswith("."):
            shutil.copy2(f, dst / f.name)
    g = onnx.load(str(Path(src) / MODEL_FILE))
    for node in g.graph.node:
        node.output[:] = ["pooled_full" if o == OUTPUT_NAME else o for o in node.output]
    g.graph.initializer.extend(
        [
            helper.make_tensor("slice_starts", TensorProto.INT64, [1], [0]),
            helper.make_tensor("slice_ends", TensorProto.INT64, [1], [dim]),
            helper.make_tensor("slice_axes", TensorProto.INT64, [1], [1]),
        ]
    )
    g.graph.node.append(
        helper.make_node(
            "Slice", ["pooled_full", "slice_starts", "slice_ends", "slice_axes"], [OUTPUT_NAME], name="matryoshka_slice"
        )
    )
    out = g.graph.output[0]
    out.type.tensor_type.shape.dim[1].ClearField("dim_param")
    out.type.tensor_type.shape.dim[1].dim_value = dim
    onnx.save(g, str(dst / MODEL_FILE))
    m = load_manifest(src).model_copy(
        update={
            "name": name,
            "version": version,
            "dimension": dim,
            "sha256": sha256_file(dst / MODEL_FILE),
            "canary": None,
            "parity": None,
        }
    )
    write_manifest(dst, m)
    sents = list(load_manifest(src).canary.sentences)
    emb = OnnxModel(dst, providers=["CPUExecutionProvider"], intra_op_threads=1).embed_sync(sents)
    write_manifest(dst, m.model_copy(update={"canary": Canary(sentences=sents, embeddings=emb.tolist())}))
    return dst


def corrupt_artifact(src: Path, models_dir: Path, name: str, version: str) -> Path:
    """A copy whose model.onnx is garbage but whose manifest sha256 matches it (so ONNX Runtime must refuse it)."""
    dst = versioned_copy(src, models_dir, name, version)
    (dst / MODEL_FILE).unlink()
    (dst / MODEL_FILE).write_bytes(b"\x08\x07this is not an onnx graph" * 1000)
    write_manifest(dst, load_manifest(dst).model_copy(update={"sha256": sha256_file(dst / MODEL_FILE)}))
    return dst


def wrong_dimension_artifact(src: Path, models_dir: Path, name: str, version: str, dim: int = 256) -> Path:
    """A copy whose manifest claims ``dim`` dimensions (canary cut to match) while the graph gives the source's."""
    dst = versioned_copy(src, models_dir, name, version)
    m = load_manifest(dst)
    canary = m.canary.model_copy(update={"embeddings": [row[:dim] for row in m.canary.embeddings]})
    write_manifest(dst, m.model_copy(update={"dimension": dim, "canary": canary}))
    return dst


# ---------------------------------------------------------------------------------------------- checks of the builders
def test_versioned_copy_validates(int8_artifact, tmp_path):
    d = versioned_copy(int8_artifact, tmp_path, NAME, "7")
    m = validate_artifact(d)
    assert (m.name, m.version, m.dimension) == (NAME, "7", 384)


def test_sliced_artifact_is_a_different_loadable_model(int8_artifact, tmp_path):
    from service.backend import OnnxModel

    full = OnnxModel(versioned_copy(int8_artifact, tmp_path, NAME, "1"), providers=["CPUExecutionProvider"])
    cut = OnnxModel(sliced_artifact(int8_artifact, tmp_path, NAME, "2", 256), providers=["CPUExecutionProvider"])
    cut.warm_up()  # canary agrees with its own manifest
    texts = ["A man is playing a guitar.", "Cats sleep most of the day."]
    a, b = full.embed_sync(texts), cut.embed_sync(texts)
    assert b.shape == (2, 256)
    want = a[:, :256] / np.linalg.norm(a[:, :256], axis=1, keepdims=True)
    np.testing.assert_allclose(b, want, atol=1e-5)  # exactly the Matryoshka cut of the source
    assert cut.info.sha256 != full.info.sha256


@pytest.mark.parametrize(
    "builder,needle", [(corrupt_artifact, "cannot open model.onnx"), (wrong_dimension_artifact, "256")]
)
def test_broken_artifacts_fail_to_load(int8_artifact, tmp_path, builder, needle):
    from service.backend import ModelLoadError, OnnxModel

    d = builder(int8_artifact, tmp_path, NAME, "9")
    with pytest.raises(ModelLoadError, match=needle):
        m = OnnxModel(d, providers=["CPUExecutionProvider"])
        m.warm_up()
