"""The server-side ``qdrant/bm25`` document vectors (service/inference/sparse) are fastembed's ``Bm25.raw_embed``
vectors exactly, while tokens' stems and ids are remembered across calls."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("fastembed")

from service.inference.sparse import Bm25, _as_dict  # noqa: E402

WORDS = (
    "The running runners ran quickly across fields; studies studied studying, a relational database relates "
    "connections connected connecting. Généralement naïve café résumé straße İstanbul ǅemal Ⅻ ⓐⒶ __init__ x_y "
    "co-operate don't I'm 3.14 ١٢٣ 日本語 テスト ＡＢＣ and of the is was were be"
).split()
EDGES = ["", "   ", "the and of", "a" * 41 + " b" * 3, "a" * 40, "\u0130\u0307 \u1e9e \u2160 \ufb01ne", "Hi, hi! HI?"]


def corpus(n: int, seed: int) -> list[str]:
    """``n`` documents of the words above, in random cases, with punctuation and repeats."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 120))]
        words = [w.upper() if rng.random() < 0.1 else w.capitalize() if rng.random() < 0.2 else w for w in words]
        out.append(" ".join(w + rng.choice(["", "", ",", ".", "!", " -", "'s"]) for w in words))
    return out


def test_documents_equal_fastembeds_vectors_across_calls():
    model = Bm25()
    first, second = corpus(300, 1) + EDGES, corpus(300, 2) + EDGES
    for texts in (first, second, first):  # the second and third calls reuse remembered stems and ids
        want = [_as_dict(e.indices, e.values) for e in model.model.raw_embed(texts)]
        assert model.documents(texts) == want
