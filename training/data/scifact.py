"""BEIR SciFact for reranker training: (query, passage, label) rows from the train qrels plus BM25 hard negatives.

Layout (``../shared/data/README.md``, BEIR's): ``beir/scifact/corpus.jsonl`` (``{_id, title, text}``; a document is
``title + " " + text``), ``queries.jsonl`` (``{_id, text}``), ``qrels/train.tsv`` (``query-id, corpus-id, score``, a
header line, CRLF). Only the train qrels are read here: the test qrels are for reporting, and the dev split that
chooses a model is carved from train, by query (:func:`split_queries`), so no query is in both.

Hard negatives (:func:`mine_negatives`; :func:`mine_dense_negatives` by a bi-encoder, :func:`merge_negatives` both):
BM25 (the ``bm25s`` library, Lucene's formula with k1 = 1.2, b = 0.75, English
stopwords, no stemmer) over the corpus; each query's top hits that are not among its positives (the qrels' judged
documents) become label-0 rows.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path

from training.data.sts import data_root


@dataclass
class SciFact:
    """The parts of SciFact reranker training reads.

    Attributes:
        corpus: ``{doc_id: "title text"}`` (BEIR's document text).
        queries: ``{query_id: claim}``.
        qrels: ``{query_id: {doc_id, ...}}``, the judged-relevant documents (score > 0) of the train qrels.
    """

    corpus: dict[str, str]
    queries: dict[str, str]
    qrels: dict[str, set[str]]


def scifact_dir() -> Path:
    """``<shared data>/beir/scifact`` (``$SHARED_DATA_DIR`` or ``../shared/data``).

    Raises:
        FileNotFoundError: the folder is missing.
    """
    d = data_root() / "beir" / "scifact"
    if not (d / "corpus.jsonl").is_file():
        raise FileNotFoundError(f"{d}: BEIR SciFact not found (corpus.jsonl); set SHARED_DATA_DIR")
    return d


def load_scifact(
    max_queries: int | None = None,
    max_corpus: int | None = None,
    seed: int = 0,
    split: str = "train",
    directory: str | Path | None = None,
) -> SciFact:
    """SciFact's (or any BEIR dataset's) corpus, queries and ``split`` qrels; optionally a small slice (tests, smoke
    runs).

    Args:
        max_queries: keep this many queries (a seeded sample), else all (SciFact: 809 train, 300 test).
        max_corpus: keep the kept queries' positives plus the first documents of the corpus up to this many, else
            all 5,183.
        split: the qrels file, ``qrels/<split>.tsv`` (train for training and its dev split; test for reporting).
        directory: a BEIR dataset folder (None: :func:`scifact_dir`).

    Raises:
        FileNotFoundError: the data is missing.
    """
    d = Path(directory) if directory else scifact_dir()
    qrels: dict[str, set[str]] = {}
    with open(d / "qrels" / f"{split}.tsv", newline="", encoding="utf-8") as f:
        rows = csv.reader(f, delimiter="\t")
        next(rows)
        for qid, did, score in rows:
            if int(score) > 0:
                qrels.setdefault(qid, set()).add(did)
    if max_queries is not None and max_queries < len(qrels):
        keep = random.Random(seed).sample(sorted(qrels), max_queries)
        qrels = {q: qrels[q] for q in sorted(keep)}
    queries = {}
    with open(d / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            if q["_id"] in qrels:
                queries[q["_id"]] = q["text"]
    wanted = set().union(*qrels.values())
    corpus = {}
    with open(d / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            if max_corpus is None or doc["_id"] in wanted or len(corpus) < max_corpus:
                corpus[doc["_id"]] = (doc.get("title", "") + " " + doc["text"]).strip()
    return SciFact(corpus, queries, {q: ds & corpus.keys() for q, ds in qrels.items() if q in queries})


def split_queries(query_ids: list[str], dev_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """``(train, dev)`` query ids: a seeded shuffle, the last ``dev_fraction`` (at least one) for dev."""
    ids = sorted(query_ids)
    random.Random(seed).shuffle(ids)
    n_dev = max(1, round(len(ids) * dev_fraction)) if dev_fraction > 0 else 0
    return sorted(ids[: len(ids) - n_dev]), sorted(ids[len(ids) - n_dev :])


def mine_negatives(data: SciFact, query_ids: list[str], depth: int) -> dict[str, list[str]]:
    """Per query, the ids of its top-``depth`` BM25 documents that are not among its positives (best first).

    BM25 by ``bm25s`` (``bm25s.BM25()``: Lucene's scoring, k1 = 1.2, b = 0.75) on the corpus, English stopwords.
    """
    import bm25s

    ids = list(data.corpus)
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize([data.corpus[i] for i in ids], stopwords="en", show_progress=False), show_progress=False
    )
    k = min(len(ids), depth + max(len(data.qrels[q]) for q in query_ids))
    tokens = bm25s.tokenize([data.queries[q] for q in query_ids], stopwords="en", show_progress=False)
    hits, _ = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    out = {}
    for q, row in zip(query_ids, hits):
        out[q] = [ids[int(j)] for j in row if ids[int(j)] not in data.qrels[q]][:depth]
    return out


def mine_dense_negatives(
    data: SciFact, query_ids: list[str], depth: int, model_dir: str | Path, max_seq_length: int = 256
) -> dict[str, list[str]]:
    """Per query, the ids of its top-``depth`` documents by cosine similarity under the bi-encoder in ``model_dir``
    (a sentence-transformers directory, e.g. the default encoder) that are not among its positives (best first).

    Exact search: every document is encoded (``SentenceTransformer.encode``, normalised, truncated to
    ``max_seq_length`` tokens; on CUDA when present) and scored against every query.
    """
    import numpy as np
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=None)
    model.max_seq_length = max_seq_length
    ids = list(data.corpus)
    docs = model.encode([data.corpus[i] for i in ids], batch_size=64, normalize_embeddings=True)
    qs = model.encode([data.queries[q] for q in query_ids], batch_size=64, normalize_embeddings=True)
    k = min(len(ids), depth + max(len(data.qrels[q]) for q in query_ids))
    out = {}
    for q, row in zip(query_ids, np.argsort(-(qs @ docs.T), axis=1)[:, :k]):
        out[q] = [ids[int(j)] for j in row if ids[int(j)] not in data.qrels[q]][:depth]
    return out


def merge_negatives(*sources: dict[str, list[str]], depth: int) -> dict[str, list[str]]:
    """Per query, the negatives of every source interleaved (first of each, then second of each, ...), duplicates
    dropped, at most ``depth``: BM25's lexical and the dense model's semantic confusions in equal parts."""
    out = {}
    for q in sources[0]:
        merged: dict[str, None] = {}
        for rank in range(max(len(s[q]) for s in sources)):
            for s in sources:
                if rank < len(s[q]):
                    merged.setdefault(s[q][rank])
        out[q] = list(merged)[:depth]
    return out


def mine(
    data: SciFact, query_ids: list[str], sources: str, depth: int, model_dir: str | Path, max_seq_length: int = 256
) -> dict[str, list[str]]:
    """Per query, up to ``depth`` hard negatives from ``sources``: ``bm25`` (:func:`mine_negatives`), ``dense`` (the
    bi-encoder in ``model_dir``, :func:`mine_dense_negatives`), ``bm25+dense`` (interleaved, :func:`merge_negatives`)
    or ``none`` (no negative: every list empty).

    Raises:
        ValueError: an unknown source.
    """
    found = []
    for kind in sources.split("+"):
        if kind == "bm25":
            found.append(mine_negatives(data, query_ids, depth))
        elif kind == "dense":
            found.append(mine_dense_negatives(data, query_ids, depth, model_dir, max_seq_length))
        elif kind != "none":
            raise ValueError(f"unknown source of hard negatives {kind!r} (bm25, dense, bm25+dense, none)")
    return merge_negatives(*found, depth=depth) if found else {q: [] for q in query_ids}


def triplets(data: SciFact, query_ids: list[str], negatives: dict[str, list[str]]) -> list[tuple[str, str, str]]:
    """``(query, positive passage, hard negative passage)``, one per judged pair of ``query_ids``; the n-th positive
    of a query takes its n-th mined negative (cycling), so a query's triplets differ in their negative. Queries
    without a mined negative are skipped."""
    out = []
    for q in query_ids:
        negs = negatives.get(q) or []
        for n, did in enumerate(sorted(data.qrels[q]) if negs else []):
            out.append((data.queries[q], data.corpus[did], data.corpus[negs[n % len(negs)]]))
    return out


def pair_rows(data: SciFact, query_ids: list[str], negatives: dict[str, list[str]]) -> dict[str, list]:
    """Columns ``query``, ``passage``, ``label`` (1.0 for a judged document, 0.0 for a mined negative), the rows of
    each query together, positives first."""
    cols: dict[str, list] = {"query": [], "passage": [], "label": []}
    for q in query_ids:
        for did, label in [(d, 1.0) for d in sorted(data.qrels[q])] + [(d, 0.0) for d in negatives[q]]:
            cols["query"].append(data.queries[q])
            cols["passage"].append(data.corpus[did])
            cols["label"].append(label)
    return cols
