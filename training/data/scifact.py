"""BEIR SciFact for reranker training: (query, passage, label) rows from the train qrels plus BM25 hard negatives.

Layout (``../shared/data/README.md``, BEIR's): ``beir/scifact/corpus.jsonl`` (``{_id, title, text}``; a document is
``title + " " + text``), ``queries.jsonl`` (``{_id, text}``), ``qrels/train.tsv`` (``query-id, corpus-id, score``, a
header line, CRLF). Only the train qrels are read here: the test qrels are for reporting, and the dev split that
chooses a model is carved from train, by query (:func:`split_queries`), so no query is in both.

Hard negatives (:func:`mine_negatives`): BM25 (the ``bm25s`` library, Lucene's formula with k1 = 1.2, b = 0.75, English
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


def load_scifact(max_queries: int | None = None, max_corpus: int | None = None, seed: int = 0) -> SciFact:
    """SciFact's corpus, queries and train qrels; optionally a small slice (tests, smoke runs).

    Args:
        max_queries: keep this many train queries (a seeded sample), else all 809.
        max_corpus: keep the kept queries' positives plus the first documents of the corpus up to this many, else
            all 5,183.

    Raises:
        FileNotFoundError: the data is missing.
    """
    d = scifact_dir()
    qrels: dict[str, set[str]] = {}
    with open(d / "qrels" / "train.tsv", newline="", encoding="utf-8") as f:
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
    retriever.index(bm25s.tokenize([data.corpus[i] for i in ids], stopwords="en", show_progress=False),
                    show_progress=False)  # fmt: skip
    k = min(len(ids), depth + max(len(data.qrels[q]) for q in query_ids))
    tokens = bm25s.tokenize([data.queries[q] for q in query_ids], stopwords="en", show_progress=False)
    hits, _ = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
    out = {}
    for q, row in zip(query_ids, hits):
        out[q] = [ids[int(j)] for j in row if ids[int(j)] not in data.qrels[q]][:depth]
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
