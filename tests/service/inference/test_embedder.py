"""``service.inference.embedder.Embedder`` in-process over a real registry and the real default artifact, on STS-B sentences.

The reference is the artifact's ONNX graph run directly with ONNX Runtime and its tokenizer (one sentence at a time,
so no padding), followed by ``artifact_contract.postprocess``: what the embedder returns must equal it within 1e-5.
The registry holds two versions of the default encoder (``minilm:1`` active, ``minilm:2`` loaded), both served by
real batchers on one event loop owned by the module.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from artifact_contract import MODEL_FILE, OUTPUT_NAME, TOKENIZER_FILE, load_manifest, postprocess
from service.inference.batch_errors import InputTooLong, RequestTooLarge
from service.inference.embedder import Embedder, InvalidInput, ModelNotReady, TokenIds
from service.inference.model_registry import ModelNotFound, ModelRegistry, load_model
from service.metrics import Metrics
from service.settings import Settings
from tests.artifact_utils import NAME, versioned_copy
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(300)

MAX_REQUEST_TOKENS = 4096


@pytest.fixture(scope="module")
def stsb() -> list[str]:
    """48 real STS-B test sentences and one far longer than ``max_seq_length`` (60 of them joined)."""
    t = load_task("STSBenchmark")
    return [s for pair in zip(t.sent1[:24], t.sent2[:24]) for s in pair] + [" ".join(t.sent1[100:160])]


@pytest.fixture(scope="module")
def env(default_artifact, tmp_path_factory):
    models = tmp_path_factory.mktemp("embedder") / "models"
    for v in ("1", "2"):
        versioned_copy(default_artifact, models, NAME, v)
    settings = Settings(
        models_dir=str(models),
        providers=["cpu"],
        intra_op_threads=1,
        inter_op_threads=1,
        max_batch_size=16,
        max_request_tokens=MAX_REQUEST_TOKENS,
    )
    metrics = Metrics()
    registry = ModelRegistry(metrics)
    loop = asyncio.new_event_loop()
    v1 = loop.run_until_complete(load_model(settings, metrics, NAME, "1"))
    v2 = loop.run_until_complete(load_model(settings, metrics, NAME, "2"))
    registry.add(v1, activate=True)
    registry.add(v2)
    yield SimpleNamespace(loop=loop, embedder=Embedder(registry), v1=v1, v2=v2)
    loop.run_until_complete(registry.close())
    loop.close()


@pytest.fixture(scope="module")
def direct(default_artifact: Path):
    """``texts -> (pooled (n, 384), token counts (n,))`` from the ONNX graph run directly, one text per run."""
    max_len = load_manifest(default_artifact).max_seq_length
    tok = Tokenizer.from_file(str(default_artifact / TOKENIZER_FILE))
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(default_artifact / MODEL_FILE), opts, providers=["CPUExecutionProvider"])

    def run(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        rows, lengths = [], []
        for t in texts:
            ids = np.asarray([tok.encode(t).ids], dtype=np.int64)
            rows.append(sess.run([OUTPUT_NAME], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0])
            lengths.append(ids.shape[1])
        return np.stack(rows).astype(np.float32), np.asarray(lengths)

    return run


def encode(env, texts, **kw):
    return env.loop.run_until_complete(env.embedder.encode(texts, **kw))


def test_encode_equals_the_onnx_graph_run_directly(env, stsb, direct):
    res = encode(env, stsb)
    pooled, lengths = direct(stsb)
    assert res.embeddings.shape == (49, 384) and res.embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(res.embeddings, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(res.embeddings, postprocess(pooled), atol=1e-5)
    assert lengths[-1] == 256  # the long text was cut to max_seq_length
    assert res.prompt_tokens == int(lengths.sum())
    assert res.model == env.v1.info and res.model.id == f"{NAME}:1"
    assert res.embeddings[0] @ res.embeddings[1] > res.embeddings[0] @ res.embeddings[3]  # a pair beats a non-pair


def test_unnormalised_rows_are_the_pooled_output(env, stsb, direct):
    res = encode(env, stsb[:10], normalize=False)
    pooled, _ = direct(stsb[:10])
    assert np.linalg.norm(res.embeddings, axis=1).min() > 2.0  # mean pooling is far from unit norm
    np.testing.assert_allclose(res.embeddings, pooled, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [1, 128, 384])
def test_dimensions_keeps_the_first_columns_and_renormalises(env, stsb, direct, dims):
    res = encode(env, stsb[:12], dimensions=dims, normalize=False)  # dimensions always renormalises
    pooled, _ = direct(stsb[:12])
    cut = pooled[:, :dims] / np.linalg.norm(pooled[:, :dims], axis=1, keepdims=True)
    assert res.embeddings.shape == (12, dims)
    np.testing.assert_allclose(res.embeddings, cut, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(res.embeddings, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("dims", [0, -1, 385])
def test_dimensions_out_of_range_is_invalid(env, stsb, dims):
    with pytest.raises(InvalidInput, match="between 1 and 384") as e:
        encode(env, stsb[:2], dimensions=dims)
    assert e.value.param == "dimensions"


def test_resolve_by_name_and_version(env, stsb):
    emb = env.embedder
    assert emb.resolve(None) is env.v1 and emb.resolve("") is env.v1
    assert emb.resolve(NAME) is env.v1  # a bare name is the active model when it has that name
    assert emb.resolve(f"{NAME}:2") is env.v2 and emb.resolve(f"{NAME}:1") is env.v1
    by_version = encode(env, stsb[:6], model=f"{NAME}:2")
    by_object = encode(env, stsb[:6], model=env.v2)
    assert by_version.model.id == by_object.model.id == f"{NAME}:2"
    np.testing.assert_allclose(by_version.embeddings, encode(env, stsb[:6]).embeddings, atol=1e-5)  # same graph
    np.testing.assert_array_equal(by_version.embeddings, by_object.embeddings)


@pytest.mark.parametrize("name", ["no-such-model", f"{NAME}:9"])
def test_unknown_model_is_not_found(env, stsb, name):
    with pytest.raises(ModelNotFound, match=name) as e:
        env.embedder.resolve(name)
    assert e.value.param == "model" and f"{NAME}:1" in e.value.available
    with pytest.raises(ModelNotFound) as e:
        env.embedder.resolve(name, param="model_id")
    assert e.value.param == "model_id"
    with pytest.raises(ModelNotFound):
        encode(env, stsb[:1], model=name)


def test_no_model_loaded_is_not_ready(env, stsb):
    empty = Embedder(ModelRegistry(Metrics()))
    for name in (None, ""):
        with pytest.raises(ModelNotReady):
            empty.resolve(name)
    with pytest.raises(ModelNotFound):  # a named model is simply not there
        empty.resolve(NAME)
    with pytest.raises(ModelNotReady):
        env.loop.run_until_complete(empty.encode(stsb[:1]))


@pytest.mark.parametrize("texts", [[], "a plain string", ["ok", 3], [None], None, [b"bytes"]])
def test_invalid_texts(env, texts):
    with pytest.raises(InvalidInput, match="non-empty list of strings") as e:
        encode(env, texts)
    assert e.value.param == "input"
    with pytest.raises(InvalidInput) as e:
        encode(env, texts, param="inputs", model="no-such-model")  # checked before the model is looked up
    assert e.value.param == "inputs"


def test_input_too_long_without_truncation(env, stsb, default_artifact):
    long = stsb[-1]
    full = Tokenizer.from_file(str(default_artifact / TOKENIZER_FILE))
    full.no_truncation()
    n = len(full.encode(long).ids)
    assert n > 256
    texts = [stsb[0], stsb[1], long, stsb[2]]
    with pytest.raises(InputTooLong) as e:
        encode(env, texts, truncate=False, param="inputs")
    err = e.value
    assert (err.index, err.n_tokens, err.max_tokens, err.at_least) == (2, n, 256, False)
    assert (err.param, err.model) == ("inputs", NAME)
    # inputs that fit are embedded the same with or without truncation
    short = texts[:2] + texts[3:]
    np.testing.assert_array_equal(
        encode(env, short, truncate=False).embeddings, encode(env, short, truncate=True).embeddings
    )


def test_request_over_max_request_tokens(env, stsb):
    texts = [stsb[-1]] * 20  # 20 x 256 tokens after truncation
    with pytest.raises(RequestTooLarge) as e:
        encode(env, texts, param="texts")
    assert (e.value.n_tokens, e.value.max_tokens, e.value.param) == (20 * 256, MAX_REQUEST_TOKENS, "texts")
    assert encode(env, texts[:16]).embeddings.shape == (16, 384)  # 4096 tokens: exactly the limit


def test_token_ids_are_run_as_they_are_for_their_model_only(env, stsb, monkeypatch):
    """A front's ids (``Embedder.encode(token_ids=)``) skip the tokenizer when made for the model that runs the
    request, and are ignored (the texts tokenized here) when made for another or when they do not fit it."""
    texts = stsb[:5] + stsb[-1:]
    ref = encode(env, texts)
    ids, v1 = env.v1.model.tokenize(texts).ids, env.v1.info
    calls = []
    real = env.v1.batcher._tokenize_fairly

    async def counted(*a, **k):
        calls.append(len(a[0]))
        return await real(*a, **k)

    monkeypatch.setattr(env.v1.batcher, "_tokenize_fairly", counted)
    res = encode(env, texts, token_ids=TokenIds(v1.id, v1.sha256, ids))
    assert calls == [] and res.prompt_tokens == ref.prompt_tokens
    np.testing.assert_array_equal(res.embeddings, ref.embeddings)
    # the ids are what runs: other (valid) ids give other rows, and their own token count
    shifted = [np.concatenate([x[:1], x[2:]]) for x in ids]
    res = encode(env, texts, token_ids=TokenIds(v1.id, v1.sha256, shifted))
    assert calls == [] and res.prompt_tokens == ref.prompt_tokens - len(texts)
    assert not np.allclose(res.embeddings, ref.embeddings, atol=1e-3)
    too_long = [np.concatenate([x, x]) for x in ids]  # the last one over max_seq_length
    for bad in (
        TokenIds(env.v2.info.id, v1.sha256, ids),  # made for minilm:2 (same weights), run by minilm:1
        TokenIds(v1.id, "0" * 64, ids),  # another ONNX file
        TokenIds(v1.id, v1.sha256, ids[:-1]),  # not one list per text
        TokenIds(v1.id, v1.sha256, [np.array([101, env.v1.model.vocab_size, 102])] + ids[1:]),  # outside the vocabulary
        TokenIds(v1.id, v1.sha256, too_long),
    ):
        calls.clear()
        res = encode(env, texts, token_ids=bad)
        assert calls == [len(texts)], bad.model
        np.testing.assert_array_equal(res.embeddings, ref.embeddings)
