"""Artifacts for the model-swap benchmarks: the default one (exported when missing), a copy under another name and
version, and a different model made from it (its embedding cut to fewer dimensions)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from artifact_contract import MODEL_FILE, OUTPUT_NAME, Canary, load_manifest, sha256_file, write_manifest
from bench.lib import REPO

DEFAULT = "all-minilm-l6-v2"
#: the name the swap benchmarks serve their versions under
NAME = "minilm"


def default_artifact() -> Path:
    """The default fp32 artifact in ``$EMBED_TEST_MODELS_DIR`` (else the repository's ``models/``), exported from
    the default encoder first when it is missing or invalid."""
    from artifact_contract import ArtifactError, validate_artifact

    out = Path(os.environ.get("EMBED_TEST_MODELS_DIR", REPO / "models")) / DEFAULT
    try:
        validate_artifact(out)
    except ArtifactError:
        from training.export import default_model_dir, export_artifact

        export_artifact(default_model_dir(), out, name=DEFAULT)
        validate_artifact(out)
    return out


def _files(src: Path, dst: Path, skip: tuple[str, ...]) -> None:
    """Copy ``src``'s files but ``skip`` and hidden ones into ``dst``; the graph is hard-linked where it can be."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if not f.is_file() or f.name in skip or f.name.startswith("."):
            continue
        try:
            if f.name != MODEL_FILE:
                raise OSError
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)


def versioned_copy(src: Path, models_dir: Path, name: str, version: str) -> Path:
    """``models_dir/name/version/``: the artifact ``src`` under another name and version (the same model)."""
    dst = Path(models_dir) / name / version
    _files(Path(src), dst, ("manifest.json",))
    write_manifest(dst, load_manifest(src).model_copy(update={"name": name, "version": version}))
    return dst


def sliced_artifact(src: Path, models_dir: Path, name: str, version: str, dim: int) -> Path:
    """``models_dir/name/version/``: a different model, ``src``'s graph whose output keeps the first ``dim`` columns
    of the pooled embedding (an ONNX ``Slice`` after it); the manifest says ``dim``, the new graph's sha256 and a
    canary recorded by running it."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    from service.inference.onnx_encoder import OnnxModel

    src, dst = Path(src), Path(models_dir) / name / version
    _files(src, dst, ("manifest.json", MODEL_FILE))
    graph = onnx.load(str(src / MODEL_FILE))
    for node in graph.graph.node:
        node.output[:] = [o if o != OUTPUT_NAME else "unsliced" for o in node.output]
    bounds = {"slice_starts": 0, "slice_ends": dim, "slice_axes": 1}
    graph.graph.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), k) for k, v in bounds.items())
    graph.graph.node.append(helper.make_node("Slice", ["unsliced", *bounds], [OUTPUT_NAME], name="matryoshka_slice"))
    width = graph.graph.output[0].type.tensor_type.shape.dim[1]
    width.ClearField("dim_param")
    width.dim_value = dim
    onnx.save(graph, str(dst / MODEL_FILE))
    source = load_manifest(src)
    manifest = source.model_copy(
        update={
            "name": name,
            "version": version,
            "dimension": dim,
            "canary": None,
            "parity": None,
            "sha256": sha256_file(dst / MODEL_FILE),
        }
    )
    write_manifest(dst, manifest)
    sentences = list(source.canary.sentences)
    emb = OnnxModel(dst, providers=["CPUExecutionProvider"], intra_op_threads=1).embed_sync(sentences)
    write_manifest(dst, manifest.model_copy(update={"canary": Canary(sentences=sentences, embeddings=emb.tolist())}))
    return dst
