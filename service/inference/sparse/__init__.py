"""Server-side sparse embedding models, by the name a collection's sparse vector binds to (``model``) and a
``Document`` names: today ``qdrant/bm25``.

``qdrant/bm25`` is fastembed's ``Bm25`` (the library Qdrant's clients and Qdrant Cloud Inference use for that model
name), run here so that a vector the server makes and one a client makes with fastembed are the same: fastembed's
tokenizer (``remove_non_alphanumeric``, ``SimpleTokenizer``), the Snowball English stemmer (``py_rust_stemmers``),
tokens longer than 40 characters and stopwords dropped, token id ``abs(mmh3.hash(stem))``, and a document's value
per token ``tf * (k + 1) / (tf + k * (1 - b + b * len / avg_len))`` with ``k = 1.2``, ``b = 0.75``,
``avg_len = 256`` (BM25's term-frequency part, Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25
and Beyond", eq. 3.15); a query's values are 1 per distinct token. The IDF part is the collection's: a sparse vector
with ``modifier: idf`` (:func:`service.collections.schema.idf`).

Nothing is fetched: fastembed reads the model directory ``sparse_bm25_path`` (setting; flag ``--sparse-bm25-path``,
env ``EMBED_SPARSE_BM25_PATH``; default the directory bundled here, whose ``english.txt`` is NLTK's English stopword
list, the list the ``Qdrant/bm25`` model repository ships). Point it at a snapshot of that repository to use its
files as published.
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from service.inference.sparse.pool import ProcessPooled

BM25 = "qdrant/bm25"
BUNDLED_BM25 = Path(__file__).parent / "qdrant_bm25"
NOT_WORD_OR_SPACE = re.compile(r"[^\w\s]")  # fastembed's remove_non_alphanumeric
WORD = re.compile(r"\w+")  # SimpleTokenizer: the runs of word characters left
#: a batch's sparse vectors packed: indices uint32 ``(total,)`` (strictly increasing within each vector), values
#: float32 ``(total,)``, offsets int64 ``(n + 1,)`` (vector ``i`` is ``[offsets[i]:offsets[i + 1]]``)
Packed = tuple[np.ndarray, np.ndarray, np.ndarray]
CACHE_TOKENS = 100_000  # distinct tokens whose stem is remembered (~20 MB at most; forgotten all at once past it)


class Bm25:
    """fastembed's ``Bm25`` over a local model directory.

    Args:
        path: a directory holding ``english.txt`` (stopwords) and ``config.json``; None: the bundled one.

    Raises:
        ImportError: fastembed is not installed.
        ValueError: ``path`` is not a directory.
    """

    name = BM25

    def __init__(self, path: str | Path | None = None) -> None:
        from fastembed.sparse.bm25 import Bm25 as FastembedBm25

        root = Path(path) if path else BUNDLED_BM25
        if not root.is_dir():
            raise ValueError(f"sparse_bm25_path {str(root)!r} is not a directory")
        self.model = FastembedBm25("Qdrant/bm25", specific_model_path=str(root), local_files_only=True)

        self._stems: dict[str, str | None] = {}  # token -> its stem (None: dropped), fastembed's Bm25._stem
        self._ids: dict[str, int] = {}  # stem -> its token id, fastembed's Bm25.compute_token_id
        self._lock = threading.Lock()

    def documents(self, texts: list[str]) -> list[dict[str, Any]]:
        """The BM25 document vectors ``{indices, values}`` of ``texts``, one batch (blocking: call it off the event
        loop). The same vectors as fastembed's ``Bm25.raw_embed`` (its steps, each token's stem and id remembered
        across calls: stemming and hashing are most of its cost), indices ascending."""
        with self._lock:  # the caches are shared by the worker threads
            tfs = [self._tf(t) for t in texts]
        out = []
        for tf in tfs:
            ids = sorted(tf)  # token ids are distinct: the order of fastembed's stable argsort
            out.append({"indices": ids, "values": [tf[i] for i in ids]})
        return out

    def document_arrays(self, texts: list[str]) -> Packed:
        """The vectors of :meth:`documents`, packed (:data:`Packed`): one batch, blocking."""
        with self._lock:
            tfs = [self._tf(t) for t in texts]
        indices: list[int] = []
        values: list[float] = []
        offsets = [0]
        for tf in tfs:
            ids = sorted(tf)
            indices += ids
            values += map(tf.__getitem__, ids)
            offsets.append(len(indices))
        return np.array(indices, np.uint32), np.array(values, np.float32), np.array(offsets, np.int64)

    def _tf(self, text: str) -> dict[int, float]:
        """``{token id: BM25 term-frequency value}`` of ``text`` (fastembed's ``_term_frequency``); the caller holds
        the lock."""
        m, stems = self.model, self._stems
        if len(stems) > CACHE_TOKENS:
            stems.clear()
            self._ids.clear()
        counts: dict[str, int] = {}  # stem -> occurrences, stems in order of first occurrence (as fastembed's)
        for token, n in Counter(WORD.findall(NOT_WORD_OR_SPACE.sub(" ", text).lower())).items():
            stem = stems.get(token, "")
            if stem == "":
                stem = stems[token] = self._stem(token)
            if stem is not None:
                counts[stem] = counts.get(stem, 0) + n
        norm = m.k * (1 - m.b + m.b * sum(counts.values()) / m.avg_len)
        tf: dict[int, float] = {}
        for stem, n in counts.items():  # fastembed's _term_frequency, operation for operation
            token_id = self._ids.get(stem)
            if token_id is None:
                token_id = self._ids[stem] = m.compute_token_id(stem)
            tf[token_id] = n * (m.k + 1)
            tf[token_id] /= n + norm
        return tf

    def _stem(self, token: str) -> str | None:
        """fastembed's ``Bm25._stem`` of one token (None: dropped)."""
        m = self.model
        lower = token.lower()
        if token in m.punctuation or lower in m.stopwords or len(token) > m.token_max_length:
            return None
        stem = m.stemmer.stem_word(lower) if m.stemmer is not None else lower
        return stem or None

    def query(self, text: str) -> dict[str, Any]:
        """The BM25 query vector ``{indices, values}`` of ``text`` (each distinct token once, value 1)."""
        e = next(iter(self.model.query_embed(text)))
        return _as_dict(e.indices, e.values)


def _as_dict(indices: Any, values: Any) -> dict[str, Any]:
    idx = np.asarray(indices, dtype=np.int64)
    order = np.argsort(idx, kind="stable")
    return {"indices": idx[order].tolist(), "values": np.asarray(values, dtype=np.float64)[order].tolist()}


class Lazy:
    """A sparse model made on its first use (fastembed's import and set-up cost ~0.4 s, paid only by services that
    use the model), thread-safe; ``documents`` and ``query`` as the model's."""

    def __init__(self, make: Any) -> None:
        self._make, self._model, self._lock = make, None, threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = self._make()
            return self._model

    def documents(self, texts: list[str]) -> list[dict[str, Any]]:
        """The model's document vectors of ``texts`` (blocking)."""
        return self._get().documents(texts)

    def document_arrays(self, texts: list[str]) -> Packed:
        """The model's packed document vectors of ``texts`` (blocking)."""
        return self._get().document_arrays(texts)

    def query(self, text: str) -> dict[str, Any]:
        """The model's query vector of ``text`` (blocking)."""
        return self._get().query(text)


def open_sparse_models(settings: Any) -> dict[str, Any]:
    """The server-side sparse models by name (``{"qdrant/bm25": model}``, each made on first use), from
    ``settings.sparse_bm25_path`` and ``settings.sparse_workers`` (0: documents tokenised on the service's worker
    threads; n >= 1: in n worker processes, :mod:`.pool`; None: 1 with 2 or more cores, else 0; queries in the
    service's process either way).

    Raises:
        ValueError: the path is not a directory (checked now, not at first use).
    """
    path = getattr(settings, "sparse_bm25_path", None)
    if path and not Path(path).is_dir():
        raise ValueError(f"sparse_bm25_path {path!r} is not a directory")
    make = partial(Bm25, path)
    local = Lazy(make)
    workers = getattr(settings, "sparse_workers", None)
    if workers is None:  # the default: a process beside the serving one where there is a core for it
        workers = 1 if (os.cpu_count() or 1) > 1 else 0
    return {BM25: ProcessPooled(make, workers, local) if workers > 0 else local}
