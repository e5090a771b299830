"""A prompt as long as the model's ``max_seq_length`` or longer is refused when the model loads.

The prompt is prepended to each input before tokenisation and the text is cut from the right to ``max_seq_length``
tokens (``service.inference.prompts``), so such a prompt would leave no token of any input: every input would embed
to the same vector. Checked on copies of the default artifact whose manifests carry such prompts, loaded by the real
:class:`~service.inference.onnx_encoder.OnnxModel` and through the registry's :func:`load_model` (what the service
does at start-up and on ``/admin/models/{name}/load``); a prompt that leaves room still loads and embeds distinct
inputs apart.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from artifact_contract import load_manifest, write_manifest
from service.inference.model_registry import load_model
from service.inference.onnx_encoder import ModelLoadError, OnnxModel
from service.inference.prompts import prompt_prefix, with_prefix
from service.metrics import Metrics
from service.settings import Settings
from tests.artifact_utils import versioned_copy

pytestmark = pytest.mark.timeout(120)

TEXTS = ["A man is playing a guitar.", "The cat sleeps on the sofa."]


def prompted_copy(src, models_dir, name: str, prompts: dict[str, str], default: str | None = None):
    """``models_dir/name/1/``: the artifact ``src`` with ``prompts`` (and ``default_prompt_name``) in its manifest."""
    dst = versioned_copy(src, models_dir, name, "1")
    m = load_manifest(dst).model_copy(update={"prompts": prompts, "default_prompt_name": default})
    write_manifest(dst, type(m).model_validate(m.model_dump()))
    return dst


def test_a_prompt_filling_max_seq_length_is_refused_at_load(default_artifact, tmp_path):
    limit = load_manifest(default_artifact).max_seq_length
    long_prompt = "word " * (2 * limit)  # about 2 x max_seq_length tokens
    exact = "word " * (limit - 2)  # with [CLS] and [SEP]: exactly max_seq_length tokens
    for name, prompts, default in (
        ("long", {"query": "query: ", "passage": long_prompt}, None),
        ("long-default", {"doc": long_prompt}, "doc"),
        ("exact", {"query": exact}, None),
    ):
        dst = prompted_copy(default_artifact, tmp_path / "models", name, prompts, default)
        with pytest.raises(ModelLoadError, match="leave no room for the input") as e:
            OnnxModel(dst, intra_op_threads=1)
        assert f"max_seq_length={limit}" in str(e.value) and str(dst) in str(e.value)
        bad = next(n for n, p in prompts.items() if p != "query: ")
        assert repr(bad) in str(e.value) and "query: " not in str(e.value)
    settings = Settings(models_dir=str(tmp_path / "models"), data_dir=str(tmp_path / "data"), intra_op_threads=1)
    with pytest.raises(ModelLoadError, match="leave no room for the input"):
        asyncio.run(load_model(settings, Metrics(), "long"))


def test_a_prompt_that_leaves_room_loads_and_keeps_inputs_apart(default_artifact, tmp_path):
    limit = load_manifest(default_artifact).max_seq_length
    prompts = {"query": "word " * (limit - 12)}  # leaves about ten tokens of each input
    model = OnnxModel(prompted_copy(default_artifact, tmp_path / "models", "roomy", prompts), intra_op_threads=1)
    prefix = prompt_prefix(model.manifest, model.info.id, name="query")
    a, b = model.embed_sync(with_prefix(prefix, TEXTS))
    assert not np.allclose(a, b, atol=1e-3)
