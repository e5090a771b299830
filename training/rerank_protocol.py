"""The reranker's evaluation protocol, one for dev and test: a claim's first-stage top ``depth`` over the whole corpus,
reordered by the reranker (alone, or fused with the first stage's score by a weight alpha), scored by nDCG@10 against
the claim's judgements over the whole corpus (BEIR's protocol, :func:`training.retrieval.ndcg_at`: a relevant
document the first stage missed still counts in the ideal DCG).

The model choice of :mod:`training.reranker` is this protocol on the dev claims (carved from SciFact's train qrels),
at alpha 1, over the first stage the reranker will rerank at test (``dev_first_stage``). The offline evaluation
(:func:`evaluate`, ``python -m training rerank-eval``) scores a grid of alpha on dev, chooses one there, then reads
the test qrels once and reports alpha 1 and the chosen alpha beside the first stage, with the dev-test gap.

First stages, computed here over the corpus as the service's native search computes them:

* ``dense``: exact cosine search with a bi-encoder (a sentence-transformers directory, default the default encoder;
  or an ONNX artifact), documents truncated to ``max_seq_length`` tokens;
* ``bm25``: the ``bm25s`` library (Lucene's BM25, k1 = 1.2, b = 0.75, English stopwords, no stemmer; the service's
  ``qdrant/bm25`` tokenises differently, so its lists differ a little);
* ``rrf`` / ``dbsf``: the two lists of ``depth`` hits fused as the native ``mode: hybrid`` fuses them (Qdrant's
  formulas: RRF ``1 / (rank + k - 1)`` with its default k = 2; DBSF each list normalised to
  ``(s - (mean - 3 sd)) / (6 sd)``, sample sd, a constant list 0.5, summed).

Fusion of the two stages (alpha): ``alpha * mm(rerank) + (1 - alpha) * mm(first stage)``, ``mm`` the min-max
normalisation over the claim's candidates (the convex combination of min-max normalised scores of Bruch, Gai &
Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval", ACM TOIS 2023, arXiv:2210.11934; min-max after Lee,
SIGIR 1997); alpha 1 is the reranker's order. The same formula as the served ``rerank.weight``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sentence_transformers.base.evaluation import BaseEvaluator

from training.data.scifact import SciFact
from training.retrieval import ndcg_at

#: ``{query id: [(doc id, first-stage score), ...]}``, best first
Run = dict[str, list[tuple[str, float]]]
#: ``{query id: {doc id: reranker raw score}}``
Scores = dict[str, dict[str, float]]
PairScorer = Callable[[list[tuple[str, str]]], Sequence[float]]
FIRST_STAGES = ("dense", "bm25", "rrf", "dbsf")
DEFAULT_ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
RRF_K = 2  # Qdrant's default ranking constant, the native hybrid's default


def bm25_run(data: SciFact, qids: Sequence[str], depth: int) -> Run:
    """BM25 (``bm25s``, English stopwords) top ``depth`` of each claim over ``data.corpus``, with scores."""
    import bm25s

    ids = list(data.corpus)
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize([data.corpus[i] for i in ids], stopwords="en", show_progress=False), show_progress=False
    )
    tokens = bm25s.tokenize([data.queries[q] for q in qids], stopwords="en", show_progress=False)
    hits, scores = retriever.retrieve(tokens, k=min(depth, len(ids)), show_progress=False, n_threads=1)
    return {
        q: [(ids[int(j)], float(s)) for j, s in zip(row, srow) if s > 0] for q, row, srow in zip(qids, hits, scores)
    }


class MemoEncoder:
    """Normalised ``(N, D)`` float32 embeddings of texts by one bi-encoder, each distinct text encoded once per
    process: the corpus is encoded once for every first stage, split (dev, test) and teacher that uses the encoder.

    Args:
        encode: texts -> normalised embeddings (``SentenceTransformer.encode`` or an ONNX artifact's). The texts of a
            call not seen before are encoded together, in their order, so a first call embeds exactly as ``encode``.
    """

    def __init__(self, encode: Callable[[list[str]], np.ndarray]) -> None:
        self.encode = encode
        self.memo: dict[str, np.ndarray] = {}

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), D)`` embeddings, float32."""
        if not texts:
            return np.asarray(self.encode([]), dtype=np.float32)
        new = list(dict.fromkeys(t for t in texts if t not in self.memo))
        if new:
            self.memo.update(zip(new, np.asarray(self.encode(new), dtype=np.float32)))
        return np.stack([self.memo[t] for t in texts])


#: ``{(directory, max_seq_length): (its files' stamp, encoder)}``
_ENCODERS: dict[tuple[str, int], tuple[dict[str, list[int]], MemoEncoder]] = {}


def encoder_fn(model: str | Path | None, max_seq_length: int = 256) -> Callable[[list[str]], np.ndarray]:
    """Texts -> normalised ``(N, D)`` embeddings by the bi-encoder ``model`` (None: the default encoder; a directory
    with ``manifest.json``: an ONNX artifact, else a sentence-transformers directory): one :class:`MemoEncoder` per
    directory and ``max_seq_length`` for the process, loaded again (memo emptied) when a file of the directory changed
    (size or mtime, :func:`training.pair_score_cache.model_stamp`).
    """
    from training.pair_score_cache import model_stamp
    from training.st_dir import default_model_dir

    path = Path(model) if model else default_model_dir()
    key, stamp = (str(path.resolve()), max_seq_length), model_stamp(path)
    if key in _ENCODERS and _ENCODERS[key][0] == stamp:
        return _ENCODERS[key][1]
    if (path / "manifest.json").is_file():
        from training.onnx_encoder import OnnxArtifactEncoder

        onnx = OnnxArtifactEncoder(path, max_seq_length=max_seq_length)
        encoder = MemoEncoder(lambda texts: onnx.encode(texts, normalize=True))
    else:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(str(path), device=None)
        st.max_seq_length = max_seq_length
        encoder = MemoEncoder(lambda texts: st.encode(list(texts), batch_size=64, normalize_embeddings=True))
    _ENCODERS[key] = (stamp, encoder)
    return encoder


def dense_run(data: SciFact, qids: Sequence[str], depth: int, encode: Callable[[list[str]], np.ndarray]) -> Run:
    """Exact cosine top ``depth`` of each claim over ``data.corpus`` by ``encode`` (normalised embeddings)."""
    ids = list(data.corpus)
    docs = np.asarray(encode([data.corpus[i] for i in ids]), dtype=np.float32)
    qs = np.asarray(encode([data.queries[q] for q in qids]), dtype=np.float32)
    sims = qs @ docs.T
    top = np.argsort(-sims, axis=1, kind="stable")[:, : min(depth, len(ids))]
    return {q: [(ids[int(j)], float(sims[i, j])) for j in top[i]] for i, q in enumerate(qids)}


def fuse_runs(runs: Sequence[Run], method: str, depth: int) -> Run:
    """The ``depth`` best of each claim by ``rrf`` (k = 2) or ``dbsf`` of ``runs`` (module docstring); ties keep the
    order in which documents first appear, list by list.

    Raises:
        ValueError: an unknown method.
    """
    if method not in ("rrf", "dbsf"):
        raise ValueError(f"fusion must be rrf or dbsf, got {method!r}")
    out: Run = {}
    for q in runs[0]:
        total: dict[str, float] = {}
        for run in runs:
            hits = run.get(q, [])
            vals = [s for _, s in hits]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            mean = statistics.fmean(vals) if vals else 0.0
            for rank, (d, s) in enumerate(hits):
                if method == "rrf":
                    x = 1.0 / (rank + 1.0 + RRF_K - 1.0)
                else:
                    x = 0.5 if sd == 0 else (s - (mean - 3 * sd)) / (6 * sd)
                total[d] = total.get(d, 0.0) + x
        out[q] = sorted(total.items(), key=lambda kv: -kv[1])[:depth]
    return out


def first_stage(
    data: SciFact,
    qids: Sequence[str],
    kind: str,
    depth: int = 100,
    encoder: str | Path | None = None,
    max_seq_length: int = 256,
) -> Run:
    """The first stage ``kind`` (``dense``, ``bm25``, ``rrf``, ``dbsf``) of ``qids``, top ``depth``, with scores.

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in FIRST_STAGES:
        raise ValueError(f"first stage must be one of {FIRST_STAGES}, got {kind!r}")
    runs = []
    if kind != "bm25":
        runs.append(dense_run(data, qids, depth, encoder_fn(encoder, max_seq_length)))
    if kind != "dense":
        runs.append(bm25_run(data, qids, depth))
    return runs[0] if len(runs) == 1 else fuse_runs(runs, kind, depth)


def min_max(xs: Sequence[float]) -> list[float]:
    """``(x - min) / (max - min)``, each in [0, 1]; all 0 when the values are equal (or there are none)."""
    lo, hi = min(xs, default=0.0), max(xs, default=0.0)
    return [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in xs]


def fused(rerank: Sequence[float], first: Sequence[float], alpha: float) -> list[float]:
    """The final scores of a claim's candidates: the reranker's raw scores at ``alpha`` 1, else
    ``alpha * min_max(rerank) + (1 - alpha) * min_max(first)`` (module docstring)."""
    if alpha >= 1.0:
        return [float(x) for x in rerank]
    return [alpha * a + (1.0 - alpha) * b for a, b in zip(min_max(rerank), min_max(first))]


def reranked(run: Run, scores: Scores, alpha: float = 1.0) -> dict[str, list[str]]:
    """Each claim's candidates ordered by :func:`fused` scores, best first (ties: the first stage's order)."""
    out = {}
    for q, hits in run.items():
        final = fused([scores[q][d] for d, _ in hits], [s for _, s in hits], alpha)
        out[q] = [hits[j][0] for j in sorted(range(len(hits)), key=lambda j: -final[j])]
    return out


def ndcg10(ranked: dict[str, list[str]], qrels: dict[str, set[str]]) -> float:
    """Mean nDCG@10 x100 over every claim of ``qrels`` (binary gains; a claim without a ranking scores 0)."""
    return 100 * statistics.fmean(ndcg_at(ranked.get(q, []), {d: 1 for d in rel}) for q, rel in qrels.items())


def pairs_of(data: SciFact, run: Run) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(keys, pairs)``: each distinct (claim id, doc id) of ``run`` and its (claim, document) texts."""
    keys = sorted({(q, d) for q, hits in run.items() for d, _ in hits})
    return keys, [(data.queries[q], data.corpus[d]) for q, d in keys]


def score_run(data: SciFact, run: Run, scorer: PairScorer) -> Scores:
    """The reranker's raw score of every candidate of ``run`` (each distinct pair once)."""
    keys, pairs = pairs_of(data, run)
    out: Scores = {}
    for (q, d), s in zip(keys, scorer(pairs) if pairs else []):
        out.setdefault(q, {})[d] = float(s)
    return out


def pair_scorer(model: str | Path, max_length: int = 256, batch_size: int = 64) -> PairScorer:
    """Raw scores (logits) of (claim, document) pairs by the reranker ``model``: an ONNX reranker artifact (a
    directory with ``manifest.json``, scored as the service scores pairs) or a ``CrossEncoder`` directory."""
    path = Path(model)
    if (path / "manifest.json").is_file():
        from training.export.reranker import onnx_pair_scores

        return lambda pairs: onnx_pair_scores(path, pairs, batch_size=batch_size).tolist()
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(str(path), max_length=max_length)
    return lambda pairs: ce.predict(pairs, batch_size=batch_size, activation_fn=None, show_progress_bar=False)


def alpha_grid(run: Run, scores: Scores, qrels: dict[str, set[str]], alphas: Sequence[float]) -> dict[float, float]:
    """``{alpha: nDCG@10 x100}`` of ``run`` reranked with each alpha."""
    return {a: ndcg10(reranked(run, scores, a), qrels) for a in alphas}


def choose_alpha(grid: dict[float, float]) -> float:
    """The alpha of the best nDCG@10 (ties, within 1e-9: the largest alpha, the reranker's weight kept highest)."""
    best = max(grid.values())
    return max(a for a, v in grid.items() if v >= best - 1e-9)


def gap(dev: float, test: float) -> float:
    """Dev minus test nDCG@10 (points): how far the dev number overstates (positive) or understates test."""
    return round(dev - test, 4) if math.isfinite(dev) and math.isfinite(test) else float("nan")


def evaluate(
    scorer: PairScorer,
    dev: SciFact,
    dev_qids: Sequence[str],
    load_test: Callable[[], SciFact],
    kind: str = "dbsf",
    depth: int = 100,
    encoder: str | Path | None = None,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> dict[str, Any]:
    """The offline evaluation: alpha chosen on dev, test read once (module docstring).

    Args:
        scorer: the reranker (:func:`pair_scorer`). dev, dev_qids: the train-qrels data and its dev claims.
        load_test: called once, after alpha is chosen: the test qrels' data (same corpus).
        kind, depth, encoder: the first stage (:func:`first_stage`). alphas: the grid.

    Returns:
        ``{"first_stage", "depth", "dev": {"first_stage", "alpha": {alpha: nDCG}}, "alpha", "test": {"first_stage",
        "alpha=1", "alpha=<chosen>"}, "gap": {"alpha=1", "alpha=<chosen>"}}``, nDCG@10 x100; ``gap`` dev - test.
    """
    qrels = {q: dev.qrels[q] for q in dev_qids}
    run = first_stage(dev, list(qrels), kind, depth, encoder)
    grid = alpha_grid(run, score_run(dev, run, scorer), qrels, sorted({*alphas, 1.0}))
    chosen = choose_alpha({a: v for a, v in grid.items() if a in set(alphas)})
    test = load_test()
    trun = first_stage(test, list(test.qrels), kind, depth, encoder)
    tscores = score_run(test, trun, scorer)
    tested = {a: ndcg10(reranked(trun, tscores, a), test.qrels) for a in sorted({1.0, chosen})}
    return {
        "first_stage": kind,
        "depth": depth,
        "dev": {"first_stage": ndcg10(_order(run), qrels), "alpha": grid},
        "alpha": chosen,
        "test": {"first_stage": ndcg10(_order(trun), test.qrels), **{f"alpha={a:g}": v for a, v in tested.items()}},
        "gap": {f"alpha={a:g}": gap(grid[a], v) for a, v in tested.items()},
        "dev_queries": len(qrels),
        "test_queries": len(test.qrels),
    }


def _order(run: Run) -> dict[str, list[str]]:
    return {q: [d for d, _ in hits] for q, hits in run.items()}


class DevEvaluator(BaseEvaluator):
    """The model choice of reranker training: a sentence-transformers evaluator (``__call__(model, output_path,
    epoch, steps) -> {metric: value}``, ``primary_metric``) scoring ``run`` (the dev claims' first stage) reranked by the model, alpha 1, by nDCG@10 against ``qrels``.

    Metrics (in [0, 1], as sentence-transformers' rerank evaluators report them): ``<name>_ndcg@10`` (the primary
    one, the reranked list) and ``<name>_first_stage_ndcg@10`` (the first stage's own order). ``last_scores``: the
    raw scores of the latest call (what a caller that has not changed the model since may reuse).
    """

    def __init__(
        self, data: SciFact, run: Run, qrels: dict[str, set[str]], name: str = "scifact-dev", batch_size: int = 64
    ):
        super().__init__()
        self.data, self.run, self.qrels, self.name, self.batch_size = data, run, qrels, name, batch_size
        self.primary_metric = f"{name}_ndcg@10"
        self.first = ndcg10(_order(run), qrels) / 100
        self.last_scores: Scores | None = None

    def __call__(
        self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1
    ) -> dict[str, float]:
        """Score the dev run's pairs with ``model`` (a ``CrossEncoder``) and return the metrics."""

        def scorer(pairs):
            return model.predict(pairs, batch_size=self.batch_size, activation_fn=None, show_progress_bar=False)

        self.last_scores = score_run(self.data, self.run, scorer)
        ndcg = ndcg10(reranked(self.run, self.last_scores), self.qrels) / 100
        return {f"{self.name}_ndcg@10": ndcg, f"{self.name}_first_stage_ndcg@10": self.first}
