"""Prompts (sentence-transformers' ``prompts`` in the manifest) end to end, through the real service (uvicorn
subprocess) on copies of the default artifact whose manifests carry prompts:

* ``minilm-prompts:1``: ``{"query": "query: ", "passage": "passage: "}``, no default (active at start);
* ``minilm-prompts:2``: ``{"query": "q2: ", "document": "doc2: "}``, ``default_prompt_name: "query"`` (published and
  loaded by a fixture, activated by the last test);
* ``plain``: no prompts.

All three are the same ONNX graph, so an embedding with a prompt must equal the embedding of the prefixed text without
one: TEI's ``prompt_name`` (``/embed``, ``/similarity``, ``/tokenize``), NIM's ``input_type`` (``/v1/embeddings``), the
default prompt, and the collections (documents with the ``passage``/``document`` prompt, queries with ``query``, on the
native and the Qdrant-compatible surface, and again after a hot swap to the new model's prompts).
"""

from __future__ import annotations

import os
import time

import httpx
import numpy as np
import pytest

from artifact_contract import load_manifest, write_manifest
from service.inference.prompts import PromptNotFound, prompt_prefix
from tests.artifact_utils import versioned_copy
from tests.server_utils import run_server

pytestmark = pytest.mark.timeout(120)

NAME = "minilm-prompts"
V1 = f"{NAME}:1"
V2 = f"{NAME}:2"
PROMPTS_1 = {"query": "query: ", "passage": "passage: "}
PROMPTS_2 = {"query": "q2: ", "document": "doc2: "}
ADMIN = {"Authorization": "Bearer admin-secret"}
TEXTS = ["A man is playing a guitar.", "A chef is cooking pasta in a small kitchen.", "The cat sleeps."]
QDRANT_TEXT = "A woman is slicing an onion."  # point 7, upserted through /qdrant


def prompted_copy(src, models_dir, name: str, version: str, prompts=None, default=None):
    """``models_dir/name/version/``: the artifact ``src`` with ``prompts`` and ``default_prompt_name`` in its
    manifest (the graph, tokenizer and canary unchanged: prompts are applied before tokenisation, canaries without)."""
    dst = versioned_copy(src, models_dir, name, version)
    m = load_manifest(dst).model_copy(update={"prompts": prompts, "default_prompt_name": default})
    write_manifest(dst, type(m).model_validate(m.model_dump()))
    return dst


@pytest.fixture(scope="module")
def env(default_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts")
    models, stage = root / "models", root / "stage"
    prompted_copy(default_artifact, models, NAME, "1", PROMPTS_1)
    prompted_copy(default_artifact, models, "plain", "1")
    prompted_copy(default_artifact, stage, NAME, "2", PROMPTS_2, "query")
    args = ["--default-model", NAME, "--admin-api-keys", "admin-secret", "--intra-op-threads", "1",
            "--log-level", "warning"]  # fmt: skip
    with run_server(models, workdir=root / "work", args=args) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        os.rename(stage / NAME / "2", models / NAME / "2")  # published after start: v1 is the active model
        for name, version in ((NAME, "2"), ("plain", "1")):
            r = c.post(f"/admin/models/{name}/load", headers=ADMIN, json={"version": version})
            assert r.status_code == 200, r.text
        yield c
        assert srv.alive(), srv.log()[-3000:]


def embed(c: httpx.Client, inputs, model: str = V1, **kw) -> np.ndarray:
    r = c.post("/embed", json={"inputs": inputs, "model": model, **kw})
    assert r.status_code == 200, r.text
    return np.asarray(r.json(), np.float32)


def openai(c: httpx.Client, inputs, model: str = V1, **kw) -> tuple[np.ndarray, int]:
    r = c.post("/v1/embeddings", json={"input": inputs, "model": model, **kw})
    assert r.status_code == 200, r.text
    body = r.json()
    return np.asarray([d["embedding"] for d in body["data"]], np.float32), body["usage"]["prompt_tokens"]


def error(r: httpx.Response, status: int, param: str) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["param"] == param, e
    return e


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, atol=2e-6)


# --------------------------------------------------------------------------------------------------------- unit
def test_prompt_prefix_rules(default_artifact):
    """Strict by name, lenient by role (``passage`` else ``document`` for documents), the default otherwise."""
    m = load_manifest(default_artifact)
    one = m.model_copy(update={"prompts": PROMPTS_1})
    two = m.model_copy(update={"prompts": {**PROMPTS_2, "passage": "p: "}, "default_prompt_name": "query"})
    assert prompt_prefix(one, "x:1", name="passage") == "passage: "
    assert prompt_prefix(one, "x:1", role="document") == "passage: " and prompt_prefix(one, "x:1") == ""
    assert prompt_prefix(two, "x:1", role="document") == "p: "  # passage before document
    assert prompt_prefix(two, "x:1") == "q2: " and prompt_prefix(two, "x:1", name="document") == "doc2: "
    assert prompt_prefix(m, "x:1", role="query") == "" and prompt_prefix(m, "x:1") == ""
    with pytest.raises(PromptNotFound, match=r"'passage', 'query'") as e:
        prompt_prefix(one, "x:1", name="doc")
    assert e.value.param == "prompt_name"
    with pytest.raises(PromptNotFound, match="defines no prompts"):
        prompt_prefix(m, "x:1", name="query")


# --------------------------------------------------------------------------------------------------- TEI routes
def test_embed_prompt_name_is_the_prefixed_text(env):
    """``/embed`` with ``prompt_name`` equals the prefixed texts without one; the prompt counts toward truncation
    (a 256-token input fits without it, not with it) and toward the tokens billed."""
    got = embed(env, TEXTS, prompt_name="query")
    close(got, embed(env, ["query: " + t for t in TEXTS]))
    close(embed(env, TEXTS, prompt_name="passage"), embed(env, ["passage: " + t for t in TEXTS]))
    assert float(np.min(np.sum(got * embed(env, TEXTS), axis=1))) < 0.999  # the prompt changed the embedding
    close(embed(env, TEXTS, model=V2), embed(env, ["q2: " + t for t in TEXTS], model=V1))  # v2's default prompt

    exact = "word " * 254  # 254 tokens + [CLS] + [SEP] = max_seq_length
    assert env.post("/embed", json={"inputs": exact, "truncate": False}).status_code == 200
    e = error(env.post("/embed", json={"inputs": exact, "truncate": False, "prompt_name": "query"}), 413, "inputs")
    assert e["code"] == "input_too_long" and "258 tokens" in e["message"]
    close(embed(env, exact + "tail", prompt_name="query"), embed(env, "query: " + exact))  # cut after the prompt


def test_unknown_prompt_is_a_422_naming_the_prompts(env):
    for path, body in [
        ("/embed", {"inputs": "x", "prompt_name": "doc"}),
        ("/tokenize", {"inputs": "x", "prompt_name": "doc"}),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"prompt_name": "doc"}}),
    ]:
        e = error(env.post(path, json=body), 422, "prompt_name")
        assert e["code"] == "invalid_value" and "'passage', 'query'" in e["message"] and V1 in e["message"], e
    e = error(env.post("/embed", json={"inputs": "x", "model": "plain", "prompt_name": "query"}), 422, "prompt_name")
    assert "defines no prompts" in e["message"], e


def test_tokenize_and_similarity_apply_the_prompt(env):
    r = env.post("/tokenize", json={"inputs": "hello world", "prompt_name": "query"})
    assert r.status_code == 200, r.text
    toks = r.json()[0]
    assert [t["text"] for t in toks] == ["[CLS]", "query", ":", "hello", "world", "[SEP]"]
    assert (toks[3]["start"], toks[3]["stop"]) == (7, 12)  # offsets into the prompted input, as TEI gives them
    a, b = TEXTS[0], TEXTS[1]
    r = env.post("/similarity", json={"inputs": {"source_sentence": a, "sentences": [b]}, "model": V1,
                                      "parameters": {"prompt_name": "query"}})  # fmt: skip
    assert r.status_code == 200, r.text
    qa, qb = embed(env, ["query: " + a, "query: " + b])
    assert r.json()[0] == pytest.approx(float(qa @ qb), abs=1e-5)


# ------------------------------------------------------------------------------------------- NIM's input_type
def test_openai_input_type(env):
    """NIM's ``input_type``: the model's prompt of that role; none on a model without it; absent: the default."""
    q, q_tokens = openai(env, TEXTS, input_type="query")
    want, want_tokens = openai(env, ["query: " + t for t in TEXTS])
    close(q, want)
    plain, plain_tokens = openai(env, TEXTS)
    assert q_tokens == want_tokens == plain_tokens + 2 * len(TEXTS)  # "query", ":" per input
    for kind in ("passage", "document"):
        close(openai(env, TEXTS, input_type=kind)[0], openai(env, ["passage: " + t for t in TEXTS])[0])
    close(openai(env, TEXTS, model=V2, input_type="passage")[0], openai(env, ["doc2: " + t for t in TEXTS])[0])
    close(openai(env, TEXTS, model="plain", input_type="query")[0], plain)  # no such prompt: unchanged
    close(openai(env, TEXTS, model=V2)[0], openai(env, ["q2: " + t for t in TEXTS])[0])  # default_prompt_name
    error(env.post("/v1/embeddings", json={"input": "x", "input_type": "search_query"}), 422, "input_type")


# ------------------------------------------------------------------------------------------------- collections
def _vector(c: httpx.Client, coll: str, pid: int) -> np.ndarray:
    r = c.get(f"/collections/{coll}/points/{pid}", params={"with_vector": "true"})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["vector"], np.float32)


def test_collections_embed_documents_and_queries_with_their_prompts(env):
    """Points' texts get the ``passage`` prompt, search texts the ``query`` prompt, on both surfaces."""
    assert env.put("/collections/docs", json={"index": "flat", "metric": "cosine"}).status_code == 200
    r = env.put("/collections/docs/points", json={"points": [{"id": i, "text": t} for i, t in enumerate(TEXTS)]})
    assert r.status_code == 200, r.text
    stored = np.stack([_vector(env, "docs", i) for i in range(len(TEXTS))])
    close(stored, embed(env, ["passage: " + t for t in TEXTS]))

    query = "Who is making music?"
    r = env.post("/collections/docs/search", json={"query": query, "top_k": 3})
    assert r.status_code == 200, r.text
    hits = r.json()
    want = stored @ embed(env, ["query: " + query])[0]
    assert [h["id"] for h in hits] == list(np.argsort(-want))
    np.testing.assert_allclose([h["score"] for h in hits], np.sort(want)[::-1], atol=1e-5)

    # Qdrant's surface: a Document upserted and queried through the same core
    doc = {"text": QDRANT_TEXT, "model": NAME}
    r = env.put("/qdrant/collections/docs/points", params={"wait": "true"}, json={"points": [{"id": 7, "vector": doc}]})
    assert r.status_code == 200, r.text
    close(_vector(env, "docs", 7), embed(env, "passage: " + QDRANT_TEXT)[0])
    r = env.post("/qdrant/collections/docs/points/query", json={"query": {"text": query, "model": NAME}, "limit": 4})
    assert r.status_code == 200, r.text
    scores = {p["id"]: p["score"] for p in r.json()["result"]["points"]}
    assert scores[0] == pytest.approx(float(want[0]), abs=1e-5)


def test_hot_swap_re_embeds_with_the_new_models_prompts(env):
    """Activating v2 re-embeds the collection with v2's ``document`` prompt (not its default ``query`` one), and
    searches then use v2's ``query`` prompt. Runs last: it changes the active model."""
    if env.get("/collections/docs").status_code == 404:
        test_collections_embed_documents_and_queries_with_their_prompts(env)
    r = env.post(f"/admin/models/{NAME}/activate", headers=ADMIN, json={"version": "2"})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 60
    while (st := env.get("/collections/docs").json())["reembedding"]["state"] != "completed":
        assert st["reembedding"]["state"] == "running" and time.monotonic() < deadline, st
        time.sleep(0.1)
    assert st["model"]["version"] == "2"
    ids, texts = [0, 1, 2, 7], [*TEXTS, QDRANT_TEXT]
    stored = np.stack([_vector(env, "docs", i) for i in ids])
    close(stored, embed(env, ["doc2: " + t for t in texts], model="plain"))  # same graph, no prompt
    r = env.post("/collections/docs/search", json={"query": "Who is making music?", "top_k": 4})
    assert r.status_code == 200, r.text
    want = dict(zip(ids, stored @ embed(env, "q2: Who is making music?", model="plain")[0]))
    np.testing.assert_allclose([h["score"] for h in r.json()], [want[h["id"]] for h in r.json()], atol=1e-5)
