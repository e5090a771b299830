"""The documents of ``scale_bench --mode hybrid``: texts of 3-5 real corpus sentences, their payloads and filters,
their client-side dense vectors (cached outside the repository) and the query set.

Corpus: ``en_sentences.txt`` (189,337 sentences; ``$SHARED_DATA_DIR/corpus`` or ``../shared/data/corpus``, read in
place). Its last 1,000 lines are the queries and never appear in a document; document ``i`` is 3-5 sentences drawn
from the rest, a deterministic function of ``(seed, i)``: each ``CHUNK`` of documents has its own generator
(``default_rng((seed, chunk))``), so the first 100k documents of a 1M run are the 100k of a 100k run and any range
can be rebuilt without the ones before it.

Payload (Qdrant keys): ``category`` ``"c00".."c99"`` (``i % 100``: each value 1 % of the documents), ``year``
1990-2024 and ``tag`` ``"t000".."t999"`` (a multiplicative hash of ``i`` mod 1000: ~0.1 % each, not nested in a
category). Both can be checked from a hit's id alone.

Dense vectors (``--dense``):

* ``encoder``: the default encoder (ONNX artifact, mean pooling, normalised) on each document's text, computed
  once and cached per chunk as ``.npy`` under the cache directory (resumable: a chunk is written when whole);
  ~15 documents/s on 2 busy cores (~2 h per 100k documents, ~19 h per 1M);
* ``random-projection``: no model: each sentence is its bag of words (lower-cased ``\\w+`` tokens, CRC32-hashed into
  2^16 buckets) times a fixed Gaussian matrix (2^16 x 384, seed 0), a document the normalised sum of its sentences'
  (a sparse random projection of the document's hashed bag of words: documents sharing words are near, as with
  text embeddings, but the geometry is not the encoder's). Deterministic, seconds for 1M documents.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from bench.lib import REPO

D = 384
CHUNK = 2_000  # documents generated (and, with the encoder, cached) at a time
HELD_OUT = 1_000  # the corpus's last lines: queries only
BUCKETS = 1 << 16
HASH = 2654435761  # Knuth's multiplicative hash: the tag of document i
DENSE_METHODS = ("encoder", "random-projection")

#: the filters measured: name -> (Qdrant filter, fraction of the documents matching, id -> matches)
FILTERS = {
    "1%": (
        {"must": [{"key": "category", "match": {"value": "c07"}}]},
        0.01,
        lambda i: i % 100 == 7,
    ),
    "0.1%": (
        {"must": [{"key": "tag", "match": {"value": "t007"}}]},
        0.001,
        lambda i: (i * HASH) % 2**32 % 1000 == 7,
    ),
}
#: the payload indexes made in the "indexed" phase: field -> Qdrant field_schema
INDEXES = {"category": "keyword", "tag": "keyword", "year": "integer"}


def corpus_path() -> Path:
    """``en_sentences.txt`` under ``$SHARED_DATA_DIR/corpus``, else ``../shared/data/corpus`` from the repository."""
    root = os.environ.get("SHARED_DATA_DIR")
    return (Path(root) if root else REPO.parent / "shared" / "data") / "corpus" / "en_sentences.txt"


def corpus_lines() -> list[str]:
    """The corpus's non-empty lines, in file order."""
    return [s for s in corpus_path().read_text(encoding="utf-8").split("\n") if s.strip()]


def payload(i: int) -> dict:
    """Document ``i``'s payload: ``{category, year, tag}`` (module docstring)."""
    h = (i * HASH) % 2**32
    return {"category": f"c{i % 100:02d}", "year": 1990 + (h // 1000) % 35, "tag": f"t{h % 1000:03d}"}


def chunk_sentences(n_lines: int, chunk: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sentence line numbers ``(CHUNK, 5)`` and lengths ``(CHUNK,)`` (3-5) of chunk ``chunk``'s documents."""
    rng = np.random.default_rng((seed, chunk))
    return rng.integers(0, n_lines - HELD_OUT, (CHUNK, 5)), rng.integers(3, 6, CHUNK)


def chunk_texts(lines: list[str], chunk: int, seed: int) -> list[str]:
    """The texts of chunk ``chunk``'s documents (sentences joined by a space)."""
    ids, lens = chunk_sentences(len(lines), chunk, seed)
    return [" ".join(lines[j] for j in row[:k]) for row, k in zip(ids.tolist(), lens.tolist())]


class DenseVectors:
    """The client's dense vectors: per chunk of documents, and for the queries (``method``: module docstring).

    Args:
        cache: the cache directory (``~/.cache/embed-bench/dense`` by default); encoder vectors go under
            ``encoder-<model>-seed<seed>-chunk<CHUNK>/`` as ``chunk_<c>.npy`` and ``queries_<n>.npy``.
    """

    def __init__(self, method: str, lines: list[str], seed: int, cache: Path, artifact: Path) -> None:
        if method not in DENSE_METHODS:
            raise ValueError(f"--dense {method!r}: one of {DENSE_METHODS}")
        self.method, self.lines, self.seed, self.artifact = method, lines, seed, artifact
        self.dir = cache / f"encoder-{artifact.name}-seed{seed}-chunk{CHUNK}"
        self._enc = self._sent = None

    def _encoder(self):
        if self._enc is None:
            from training.onnx_encoder import OnnxArtifactEncoder

            self._enc = OnnxArtifactEncoder(self.artifact, intra_op_threads=os.cpu_count() or 1)
        return self._enc

    def _sentences(self) -> np.ndarray:
        """``(len(lines), D)`` float32: each line's hashed bag of words times the Gaussian matrix (unnormalised)."""
        if self._sent is None:
            from scipy.sparse import csr_matrix

            rows, cols = [], []
            for r, s in enumerate(self.lines):
                toks = re.findall(r"\w+", s.lower())
                cols += [zlib.crc32(t.encode()) % BUCKETS for t in toks]
                rows += [r] * len(toks)
            bag = csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(len(self.lines), BUCKETS))
            R = np.random.default_rng(0).standard_normal((BUCKETS, D), dtype=np.float32)
            self._sent = np.asarray(bag @ R, dtype=np.float32)
        return self._sent

    def _project(self, ids: np.ndarray, lens: np.ndarray) -> np.ndarray:
        S = self._sentences()
        mask = (np.arange(ids.shape[1])[None, :] < lens[:, None]).astype(np.float32)
        V = np.einsum("nk,nkd->nd", mask, S[ids])
        return V / np.maximum(np.linalg.norm(V, axis=1, keepdims=True), 1e-12)

    def chunk(self, c: int) -> np.ndarray:
        """``(CHUNK, D)`` float32 unit vectors of chunk ``c``'s documents (encoder: read from or written to cache)."""
        if self.method == "random-projection":
            return self._project(*chunk_sentences(len(self.lines), c, self.seed))
        path = self.dir / f"chunk_{c:05d}.npy"
        if path.exists():
            return np.load(path)
        V = self._encoder().encode(chunk_texts(self.lines, c, self.seed), batch_size=32).astype(np.float32)
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, V)
        tmp.replace(path)
        return V

    def queries(self, n: int) -> tuple[list[str], np.ndarray]:
        """The first ``n`` held-out lines and their ``(n, D)`` unit vectors (the documents' method)."""
        first = len(self.lines) - HELD_OUT
        texts = self.lines[first : first + n]
        if self.method == "random-projection":
            return texts, self._project(np.arange(first, first + n)[:, None], np.ones(n, np.int64))
        path = self.dir / f"queries_{n}.npy"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            np.save(path, self._encoder().encode(texts, batch_size=32).astype(np.float32))
        return texts, np.load(path)


def batches(n_docs: int, batch: int) -> Iterator[tuple[int, int, int]]:
    """``(chunk, first id, end id)`` of the upserts of ``n_docs`` documents, at most ``batch`` per request and
    never across two chunks (a ``batch`` that divides ``CHUNK`` keeps every request full)."""
    s = 0
    while s < n_docs:
        e = min(s + batch, n_docs, (s // CHUNK + 1) * CHUNK)
        yield s // CHUNK, s, e
        s = e
