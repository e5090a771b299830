"""Artifact builders for the hot-swap tests: versioned copies, sliced (different) models and
deliberately broken artifacts, all made from a real exported artifact."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from artifact_contract import (
    MODEL_FILE,
    OUTPUT_NAME,
    Canary,
    load_manifest,
    sha256_file,
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

    from service.inference.onnx_encoder import OnnxModel

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
