"""``POST /similarity``: cosine similarity of a source sentence against sentences, or of pairs."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request, Response

from service.http.inference.schemas import SimilarityRequest, TeiOptions
from service.http.kit import JSONRoute, check_client_batch, embedder_of, json_response

router = APIRouter(route_class=JSONRoute)


@router.post("/similarity")
async def similarity(body: SimilarityRequest, request: Request) -> Response:
    """``{"scores": [float], "model": str}``: cosine of ``sentences[i]`` with ``source_sentence``, or of ``pairs[i]``;
    TEI's form (``{"inputs": {"source_sentence", "sentences"}}``) gets TEI's answer, the bare ``[float]`` (TEI API
    reference, ``POST /similarity``), and its ``parameters`` (``truncate``, ``truncation_direction``, ``prompt_name``:
    the model's prompt prepended to every sentence, as ``/embed`` does; none named: its default prompt, if any).

    Each distinct text is embedded once. The input count checked against
    ``max_client_batch_size`` is the number of texts sent (1 + len(sentences), or 2 x len(pairs)).
    """
    if body.pairs is not None:
        left, right = [p[0] for p in body.pairs], [p[1] for p in body.pairs]
        param = "pairs"
    else:
        left, right = [body.source_sentence] * len(body.sentences), list(body.sentences)
        param = "sentences"
    n_sent = 2 * len(left) if body.pairs is not None else 1 + len(right)
    check_client_batch(n_sent, request.app.state.settings, param)
    uniq = list(dict.fromkeys(left + right))
    pos = {t: i for i, t in enumerate(uniq)}
    opts = body.parameters or TeiOptions()
    truncate = body.truncate if opts.truncate is None else opts.truncate
    res = await embedder_of(request).encode(
        uniq,
        model=body.model,
        truncate=truncate,
        truncation_direction=opts.truncation_direction,
        param=param,
        prompt_name=opts.prompt_name,
    )
    e = res.embeddings
    a = e[[pos[t] for t in left]]
    b = e[[pos[t] for t in right]]
    scores = np.einsum("ij,ij->i", a, b).astype(np.float64)
    if body.inputs is not None:
        return json_response(scores.tolist())
    return json_response({"scores": scores.tolist(), "model": res.model.name})
