"""Bi-encoder fine-tuning on a retrieval task (``data.mode: retrieval``): the training triplets and the evaluation.

The task is a BEIR dataset folder, ``data.train_file`` (a path, or one under the shared data root:
``beir/scifact``). The train qrels' queries are split by query into train and dev (``data.dev_fraction``, seeded by
``data.split_seed`` so every seed of a comparison sees the same split); training sees only the train part:

* triplets ``(query, judged passage, mined hard negative)`` (:func:`training.data.scifact.triplets`), negatives
  mined from the whole corpus by BM25, by the starting bi-encoder, or both interleaved (``data.hard_negatives``),
  judged documents excluded; the objective is supervised InfoNCE with in-batch and hard negatives (supervised
  SimCSE, Gao et al., arXiv:2104.08821, Eq. 5, with the 3R paper's optional reduction on top);
* model choice: nDCG@10 of the dev queries, searched over the whole corpus (:func:`evaluate_retrieval`);
* the report: nDCG@10 and Recall@100 of the ``data.eval_split`` qrels (BEIR's test split), once, for the chosen
  checkpoint.

nDCG@10 follows BEIR's protocol (pytrec_eval's ``ndcg_cut_10``: the qrels' gains, log2 discount, the ideal DCG from
the qrels); exact cosine search over every document.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.scifact import SciFact, load_scifact

log = logging.getLogger("training.retrieval")
EncodeFn = Callable[[Sequence[str]], np.ndarray]  # texts -> (N, D) float32


def ndcg_at(ranked: Sequence[str], relevant: dict[str, int], k: int = 10) -> float:
    """nDCG@k of one ranking (document ids, best first) against graded judgements ``{doc id: gain}``, in [0, 1]."""
    dcg = sum(relevant.get(d, 0) / np.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sum(g / np.log2(i + 2) for i, g in enumerate(sorted(relevant.values(), reverse=True)[:k]))
    return float(dcg / ideal) if ideal else 0.0


def evaluate_retrieval(
    encode: EncodeFn, data: SciFact, query_ids: Sequence[str] | None = None, depth: int = 100
) -> dict[str, float]:
    """Dense retrieval of ``query_ids`` (None: every query with judgements) over ``data.corpus`` by cosine
    similarity of ``encode``'s embeddings; returns ``{"ndcg@10", "recall@100"}`` x100 (means over the queries).

    ``encode``: texts → ``(N, D)`` embeddings (normalised here). Exact search: an ``(Q, N_docs)`` score matrix.
    """
    qids = [q for q in (query_ids if query_ids is not None else data.qrels) if data.qrels.get(q)]
    ids = list(data.corpus)
    docs = _normalise(encode([data.corpus[d] for d in ids]))
    queries = _normalise(encode([data.queries[q] for q in qids]))
    k = min(depth, len(ids))
    top = np.argsort(-(queries @ docs.T), axis=1)[:, :k]
    ndcg, recall = [], []
    for q, row in zip(qids, top):
        ranked = [ids[int(j)] for j in row]
        rel = {d: 1 for d in data.qrels[q]}
        ndcg.append(ndcg_at(ranked, rel))
        recall.append(len(set(ranked) & data.qrels[q]) / len(data.qrels[q]))
    return {"ndcg@10": 100 * float(np.mean(ndcg)), f"recall@{k}": 100 * float(np.mean(recall))}


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@dataclass
class RetrievalTask:
    """The split, the mined negatives and the triplets of one retrieval fine-tuning run.

    Attributes:
        data: the train qrels' queries, the corpus. train_queries, dev_queries: the split by query.
        negatives: ``{query id: [doc id, ...]}`` mined hard negatives (best first). triplets: the training examples.
        name: the dataset folder's name (metric names: ``<name>-dev-ndcg@10``).
        directory: the BEIR folder.
    """

    data: SciFact
    train_queries: list[str]
    dev_queries: list[str]
    negatives: dict[str, list[str]]
    triplets: list[tuple[str, str, str]]
    name: str
    directory: Path
    max_corpus: int | None = None

    @classmethod
    def build(
        cls,
        directory: str | Path,
        *,
        dev_fraction: float,
        split_seed: int,
        hard_negatives: str,
        negatives_depth: int,
        model_dir: str | Path,
        max_seq_length: int,
        max_queries: int | None = None,
        max_corpus: int | None = None,
    ) -> RetrievalTask:
        """Load the train qrels, split them, mine negatives (``hard_negatives``: ``bm25``, ``dense`` — the
        bi-encoder in ``model_dir`` —, ``bm25+dense`` interleaved, or ``none``: in-batch negatives only) and build
        the triplets of the train queries (``none``: no triplet, see ``data.mode: pairs``).

        Raises:
            FileNotFoundError: the dataset is missing. ValueError: unknown ``hard_negatives``.
        """
        from training.data.scifact import mine, split_queries, triplets
        from training.data.sts import data_root

        if not Path(directory).is_dir():  # a path under the shared data root, e.g. beir/scifact
            directory = data_root() / directory
        data = load_scifact(max_queries, max_corpus, split_seed, directory=directory)
        train_q, dev_q = split_queries(list(data.qrels), dev_fraction, split_seed)
        negatives = mine(data, train_q, hard_negatives, negatives_depth, model_dir, max_seq_length)
        rows = triplets(data, train_q, negatives)
        log.info(
            "retrieval data: %d train / %d dev queries, %d triplets, negatives %s",
            len(train_q),
            len(dev_q),
            len(rows),
            hard_negatives,
        )
        return cls(data, train_q, dev_q, negatives, rows, Path(directory).name, Path(directory), max_corpus)

    def dev(self, encode: EncodeFn) -> float:
        """nDCG@10 x100 of the dev queries over the whole corpus (the model choice)."""
        return evaluate_retrieval(encode, self.data, self.dev_queries)["ndcg@10"]

    def report(self, encode: EncodeFn, split: str = "test") -> dict[str, float]:
        """nDCG@10 and Recall@100 x100 of the ``split`` qrels (``<name>-<split>-ndcg@10``, ...), every query (over
        the corpus slice when ``max_corpus`` is set: a smoke run's number, not the dataset's)."""
        test = load_scifact(max_corpus=self.max_corpus, split=split, directory=self.directory)
        return {f"{self.name}-{split}-{k}": v for k, v in evaluate_retrieval(encode, test).items()}


__all__ = ["RetrievalTask", "evaluate_retrieval", "ndcg_at"]
