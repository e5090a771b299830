"""``POST /v1/embeddings`` = ``POST /embeddings`` (OpenAI shape); ``POST /embed`` = ``POST /``, ``POST /tokenize`` and
``POST /decode`` (TEI shapes)."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from service.http.errors import APIError
from service.http.inference.schemas import (
    TOKEN_IDS_REFUSED,
    DecodeRequest,
    EmbeddingsRequest,
    EmbedRequest,
    TokenizeRequest,
    as_list,
)
from service.http.kit import JSONRoute, check_client_batch, embedder_of, json_response
from service.inference.prompts import INPUT_TYPES, with_prefix

router = APIRouter(route_class=JSONRoute)


def model_headers(info) -> dict[str, str]:
    """``X-Model: name:version`` and ``X-Model-Sha256``: which model made the embeddings of this response."""
    return {"X-Model": info.id, "X-Model-Sha256": info.sha256}


def b64_row(row: np.ndarray) -> str:
    """Little-endian float32 bytes of one embedding, base64-encoded (what the OpenAI SDKs decode)."""
    return base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")


@router.post("/v1/embeddings")
@router.post("/embeddings")  # the same without the version prefix, as TEI and Infinity serve it
async def create_embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    """OpenAI embeddings: ``{object:"list", data:[{object:"embedding", embedding, index}], model, model_version, usage}``.

    ``model`` is the name of the model that made the embeddings, ``model_version`` its version (also
    in the ``X-Model: name:version`` header, which ``/embed`` sends too).

    Rows are L2-normalised; ``dimensions`` keeps the first columns and renormalises.
    ``embedding`` is a float list, or a base64 string of little-endian float32 with
    ``encoding_format="base64"``. NVIDIA NIM's ``input_type`` (``query``, ``passage``) picks the model's prompt of
    that role, if it has one (``service.http.inference.schemas.EmbeddingsRequest``); without it the model's default prompt, if any,
    applies. Errors: 404 unknown model, 413 too many inputs,
    422 invalid input/dimensions/input_type, 422 ``token_ids_unsupported`` for ``input`` as token arrays (why:
    ``service.http.inference.schemas.TOKEN_IDS_REFUSED``), 429 queue full.
    """
    if isinstance(body.input, list) and not all(isinstance(t, str) for t in body.input):
        raise APIError(422, TOKEN_IDS_REFUSED, param="input", code="token_ids_unsupported")
    texts = as_list(body.input)
    check_client_batch(len(texts), request.app.state.settings, "input")
    role = INPUT_TYPES[body.input_type] if body.input_type is not None else None
    res = await embedder_of(request).encode(
        texts, model=body.model, dimensions=body.dimensions, param="input", prompt_role=role
    )
    if body.encoding_format == "base64":
        data = [{"object": "embedding", "index": i, "embedding": b64_row(r)} for i, r in enumerate(res.embeddings)]
    else:
        rows = np.ascontiguousarray(res.embeddings, dtype=np.float32)
        data = [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)]
    return json_response(
        {
            "object": "list",
            "data": data,
            "model": res.model.name,
            "model_version": res.model.version,
            "usage": {"prompt_tokens": res.prompt_tokens, "total_tokens": res.prompt_tokens},
        },
        headers=model_headers(res.model),
    )


@router.post("/embed")
@router.post("/")  # TEI's route for an embedding model: where a TEI client given the server's URL posts
async def embed(body: EmbedRequest, request: Request) -> Response:
    """TEI embed: ``[[float]]``, one row per input in order.

    ``normalize=false`` returns the pooled vectors; ``truncate=false`` makes an input over
    ``max_seq_length`` tokens a 413 naming its token count; ``truncation_direction="left"`` keeps the end of an
    over-long input instead of its start. ``prompt_name`` prepends that prompt of the model's to every input before
    tokenisation (TEI API reference, ``EmbedRequest.prompt_name``; none named: the model's ``default_prompt_name``);
    a name the model does not define is a 422 ``invalid_value`` listing its prompts.
    """
    texts = as_list(body.inputs)
    check_client_batch(len(texts), request.app.state.settings, "inputs")
    res = await embedder_of(request).encode(
        texts,
        model=body.model,
        truncate=body.truncate is not False,
        truncation_direction=body.truncation_direction,
        normalize=body.normalize,
        dimensions=body.dimensions,
        param="inputs",
        prompt_name=body.prompt_name,
    )
    return json_response(np.ascontiguousarray(res.embeddings, dtype=np.float32), headers=model_headers(res.model))


def _tei_tokens(text: str, enc) -> list[dict]:
    """TEI's ``SimpleToken`` list of one encoding: a special token's own string and no offsets, any other token the
    input's characters ``[start, stop)`` (character offsets, as TEI gives them)."""
    return [
        {"id": i, "text": tok, "special": True, "start": None, "stop": None}
        if special
        else {"id": i, "text": text[a:z], "special": False, "start": a, "stop": z}
        for i, tok, (a, z), special in zip(enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask)
    ]


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """TEI tokenize: ``[[{id, text, special, start, stop}]]``, one list per input, untruncated (the tokens the model
    would see before ``max_seq_length`` cuts them). With a prompt (``prompt_name``, else the model's default, as
    ``/embed`` applies them) the tokens are those of the prompted input, and offsets count the prompt's characters
    (as TEI's do); an unknown ``prompt_name`` is a 422."""
    texts = as_list(body.inputs)
    check_client_batch(len(texts), request.app.state.settings, "inputs")
    emb = embedder_of(request)
    lm = emb.resolve(body.model)
    texts = with_prefix(emb.prompt(lm, name=body.prompt_name), texts)
    encs, info = await emb.tokens(texts, model=lm, add_special_tokens=body.add_special_tokens)
    out = await run_in_threadpool(lambda: [_tei_tokens(t, e) for t, e in zip(texts, encs)])
    return json_response(out, headers=model_headers(info))


@router.post("/decode")
async def decode(body: DecodeRequest, request: Request) -> Response:
    """TEI decode: ``[str]``, the text of each token-id list (``ids`` one list or a list of lists); special tokens
    dropped unless ``skip_special_tokens=false``; an id outside the vocabulary is a 422."""
    ids = body.ids if isinstance(body.ids[0], list) else [body.ids]
    check_client_batch(len(ids), request.app.state.settings, "ids")
    texts, info = await embedder_of(request).decode(ids, model=body.model, skip_special_tokens=body.skip_special_tokens)
    return json_response(texts, headers=model_headers(info))
