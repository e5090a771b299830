"""``service.front.tokenizing.FrontTokenizers`` in-process on a prompted copy of the default artifact, and the
internal call's ``tokens`` field (``service.http.inference.internal``).

The reference is the artifact's ``tokenizer.json`` loaded with the ``tokenizers`` library and cut as the model's
``max_seq_length`` says, applied to the prompted text: a front's ids must be exactly these (the core runs them as they
are). Until a front has learnt a model from the core's answer, and for what it cannot reproduce (an unknown prompt,
another model's name, a request over ``MAX_CHARS``), it sends none.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
from tokenizers import Tokenizer

from artifact_contract import TOKENIZER_FILE, load_manifest
from service.front.tokenizing import MAX_CHARS, FrontTokenizers
from service.http.errors import APIError
from service.http.inference import internal
from service.inference.embedder import TokenIds
from service.metrics import Metrics
from tests.service.inference.test_prompts import prompted_copy
from training.data.sts import load_task

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def prompted(default_artifact, tmp_path_factory):
    return prompted_copy(default_artifact, tmp_path_factory.mktemp("front-tok"), "minilm-prompts", "1", PROMPTS)


def _reference(artifact, texts: list[str], direction: str = "right", truncate: bool = True) -> list[list[int]]:
    tok = Tokenizer.from_file(str(artifact / TOKENIZER_FILE))
    tok.no_padding()
    if truncate:
        tok.enable_truncation(max_length=load_manifest(artifact).max_seq_length, direction=direction)
    else:
        tok.no_truncation()  # the file's own setting is not the service's
    return [tok.encode(t).ids for t in texts]


async def _learnt(fronts: FrontTokenizers, requested: str | None, model_id: str, sha: str, path: str) -> bool:
    fronts.learn(requested, model_id, sha, path)
    for _ in range(200):  # loaded in the front's tokenizer thread
        if await fronts.tokens(["probe"], {"model": requested}) is not None:
            return True
        await asyncio.sleep(0.05)
    return False


def test_front_ids_are_the_tokenizers_own_with_the_models_prompt(prompted, caplog):
    t = load_task("STSBenchmark")
    texts = list(t.sent1[:8]) + [" ".join(t.sent1[100:160])]  # the last one is cut to 256 tokens
    m = load_manifest(prompted)
    mid = f"{m.name}:{m.version}"

    async def run():
        fronts = FrontTokenizers(Metrics())
        assert await fronts.tokens(texts, {}) is None  # nothing learnt yet
        assert await _learnt(fronts, None, mid, m.sha256, str(prompted))
        got = {}
        for key, options in {
            "plain": {},
            "query": {"prompt_role": "query"},
            "passage": {"prompt_name": "passage"},
            "left": {"truncation_direction": "left"},
            "untruncated": {"truncate": False},
        }.items():
            tokens = await fronts.tokens(texts, options)
            assert isinstance(tokens, TokenIds) and (tokens.model, tokens.sha256) == (mid, m.sha256)
            got[key] = [x.tolist() for x in tokens.ids]
        # what a front cannot reproduce goes as texts: an unknown prompt, a model not learnt under that name,
        # a request over MAX_CHARS
        assert await fronts.tokens(texts, {"prompt_name": "nope"}) is None
        assert await fronts.tokens(texts, {"model": mid}) is None
        assert await fronts.tokens(["x" * (MAX_CHARS + 1)], {}) is None
        # an answer naming a model its directory does not hold (a stale path): never loaded, logged
        with caplog.at_level(logging.WARNING, logger="service.front"):
            assert not await _learnt(fronts, "other", "other:1", m.sha256, str(prompted))
        fronts.close()
        return got

    got = asyncio.run(run())
    assert got["plain"] == _reference(prompted, texts) and len(got["plain"][-1]) == 256
    assert got["query"] == _reference(prompted, ["query: " + x for x in texts])
    assert got["passage"] == _reference(prompted, ["passage: " + x for x in texts])
    assert got["left"] == _reference(prompted, texts, "left") and got["left"][-1] != got["plain"][-1]
    assert got["untruncated"] == _reference(prompted, texts, truncate=False) and len(got["untruncated"][-1]) > 256
    assert "no tokenizer for other:1" in caplog.text


def test_internal_tokens_field_round_trip_and_refusals():
    ids = [np.array([101, 2023, 102]), np.array([101, 102]), np.array([101, 7, 8, 9, 102])]
    body = internal.encode_request(["a", "b", "c"], {"truncate": True}, TokenIds("m:1", "ab" * 32, ids))
    texts, options, tokens = internal.decode_request(body)
    assert texts == ["a", "b", "c"] and options == {"truncate": True}
    assert (tokens.model, tokens.sha256) == ("m:1", "ab" * 32)
    assert [x.tolist() for x in tokens.ids] == [x.tolist() for x in ids] and tokens.ids[0].dtype == np.int64
    assert internal.decode_request(internal.encode_request(["a"], {}))[2] is None
    good = {"model": "m:1", "sha256": "s", "lengths": [3], "ids": "ZQAAAGYAAABnAAAA"}  # 101, 102, 103 as int32
    assert internal.decode_request(internal.encode_request(["a"], {})[:-1] + b',"tokens":' + _j(good) + b"}")[2]
    for bad in (
        {**good, "lengths": [2]},  # lengths do not add up to the ids
        {**good, "lengths": [1, 2]},  # not one list per text
        {**good, "ids": "not base64!"},
        {**good, "model": 1},
        {k: v for k, v in good.items() if k != "sha256"},
    ):
        with pytest.raises(APIError) as e:
            internal.decode_request(internal.encode_request(["a"], {})[:-1] + b',"tokens":' + _j(bad) + b"}")
        assert e.value.status == 400


def _j(obj) -> bytes:
    import orjson

    return orjson.dumps(obj)
