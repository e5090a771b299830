"""The inference port: ModelRef's persisted form, the adapter's translation of inference errors, and the HTTP answers
of the port's errors (the same as those of the inference errors they stand for)."""

from __future__ import annotations

import json

import pytest

from service.collections import errors as col
from service.collections.ports import ModelRef
from service.http.errors import to_api_error
from service.inference.batch_errors import QueueFull
from service.inference.embedder import ModelNotReady
from service.inference.model_registry import ModelNotFound
from service.inference.reranker import NoRerankerLoaded
from service.inference_port import InferenceAdapter, translated

STORED = {"name": "all-minilm-l6-v2", "version": "1", "sha256": "a" * 64}


def test_model_ref_round_trips_the_persisted_form_byte_for_byte():
    ref = ModelRef.from_dict(STORED)
    assert ref.id == "all-minilm-l6-v2:1"
    assert json.dumps(ref.to_dict()) == json.dumps(STORED)
    assert ModelRef.from_dict({**STORED, "extra": 1}) == ref
    with pytest.raises(AttributeError):
        ref.name = "other"  # frozen


def _not_found() -> ModelNotFound:
    e = ModelNotFound("x", ["a"])
    e.param = "rerank.model"
    return e


@pytest.mark.parametrize(
    "raised, port_error",
    [
        (ModelNotReady("no model is loaded yet"), col.ModelNotReady),
        (_not_found(), col.ModelNotFound),
        (NoRerankerLoaded(["a"], "rerank.model"), col.RerankerNotLoaded),
        (QueueFull("queue full (8 requests)"), col.InferenceOverloaded),
    ],
)
def test_inference_errors_become_the_ports_with_the_same_answer(raised, port_error):
    with pytest.raises(port_error) as got:
        with translated():
            raise raised
    assert str(got.value) == str(raised)
    want, have = to_api_error(raised), to_api_error(got.value)
    assert (have.status, have.body(), have.headers) == (want.status, want.body(), want.headers)


def test_no_embedder_is_model_not_ready():
    adapter = InferenceAdapter(lambda: None, None, {})
    with pytest.raises(col.ModelNotReady, match="service is starting"):
        adapter.active_model()
    assert to_api_error(col.ModelNotReady("service is starting")).body()["error"]["code"] == "model_not_ready"
