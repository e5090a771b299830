"""Artifacts for the hot-swap tests, built cheaply from the default ones, and checks of the builders.

* :func:`versioned_copy`: an existing artifact re-labelled ``models/<name>/<version>/``
  (model.onnx hard-linked when possible; manifest rewritten with the new name/version).
* :func:`sliced_artifact`: a genuinely different model — the source graph followed by an
  ONNX ``Slice`` keeping the first ``dim`` columns of ``sentence_embedding`` — with its
  own sha256 and a canary recorded from the new graph, so it loads like any export.
* :func:`corrupt_artifact` / :func:`wrong_dimension_artifact`: artifacts that must fail to load.
"""

from __future__ import annotations

import numpy as np
import pytest

from artifact_contract import (
    validate_artifact,
)
from tests.artifact_utils import (
    NAME,
    corrupt_artifact,
    sliced_artifact,
    versioned_copy,
    wrong_dimension_artifact,
)


def test_versioned_copy_validates(int8_artifact, tmp_path):
    d = versioned_copy(int8_artifact, tmp_path, NAME, "7")
    m = validate_artifact(d)
    assert (m.name, m.version, m.dimension) == (NAME, "7", 384)


def test_sliced_artifact_is_a_different_loadable_model(int8_artifact, tmp_path):
    from service.inference.onnx_encoder import OnnxModel

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
    from service.inference.onnx_encoder import ModelLoadError, OnnxModel

    d = builder(int8_artifact, tmp_path, NAME, "9")
    with pytest.raises(ModelLoadError, match=needle):
        m = OnnxModel(d, providers=["CPUExecutionProvider"])
        m.warm_up()
