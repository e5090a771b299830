"""The reranker backend: cross-encoder artifacts (``task: "reranker"``) loaded next to the embedding models.

* :class:`OnnxReranker`: an :class:`~service.inference.onnx_encoder.OnnxModel` whose inputs are (query, passage) pairs, tokenized as
  a pair (``[CLS] query [SEP] passage [SEP]``, longest-first truncation to ``max_seq_length``: what the Hugging Face
  tokenizer does for sentence-transformers' ``CrossEncoder.predict``), and whose graph answers ``logits``
  ``(batch, 1)``, one raw score per pair (the segment ids are made inside the graph, so the inputs are the
  contract's two: ``models/README.md``). Its batches go through the model's ordinary
  :class:`~service.inference.batcher.Batcher` (token budget, fairness across requests, deadlines, 413/429): a pair is one input.
* :func:`open_model`: the class an artifact's manifest asks for (the registry loads every model through it).
* :class:`WrongModelTask`: a reranker asked for embeddings, or an embedding model asked to rerank.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from artifact_contract import RERANK_OUTPUT_NAME, load_manifest
from service.inference.onnx_encoder import ModelLoadError, OnnxModel, Tokenized

Pair = tuple[str, str]


class WrongModelTask(LookupError):
    """A request named a model of the other task: a reranker for embeddings (code ``not_an_embedding_model``) or an
    embedding model for reranking (``not_a_reranker``); a 422 naming ``param``."""

    def __init__(self, name: str, task: str, wanted: str, param: str = "model") -> None:
        super().__init__(
            f"model {name!r} is {'a reranker' if task == 'reranker' else 'an embedding model'}; this "
            f"route needs {'a reranker' if wanted == 'reranker' else 'an embedding model'}"
        )
        self.param = param
        self.code = "not_a_reranker" if wanted == "reranker" else "not_an_embedding_model"


class OnnxReranker(OnnxModel):
    """A validated, warmed-up cross-encoder artifact: :meth:`tokenize` takes (query, passage) pairs and :meth:`run`
    answers raw scores ``(batch, 1)`` (the graph's ``logits``). Arguments and errors: :class:`OnnxModel`'s."""

    OUTPUT = RERANK_OUTPUT_NAME

    def tokenize(self, texts: list[Pair], truncate: bool = True, direction: str = "right") -> Tokenized:  # type: ignore[override]
        """Token ids of each (query, passage) pair (no padding): ``truncate`` cuts the pair to ``max_seq_length``
        tokens, longest side first, from its end (``direction="right"``) or start (``"left"``); else the caller refuses
        an over-long pair. Each side is read up to :attr:`char_budget` characters first (as
        :meth:`OnnxModel.tokenize` does for a text), and tokenized whole when the cut may have lost tokens."""
        budget = self.char_budget
        left = truncate and direction == "left"
        tok = (self._tok_left if left else self._tok_trunc) if truncate else self._tok_full

        def cut(t: str) -> str:
            return t if len(t) <= budget else t[-budget:] if left else t[:budget]

        ids = [np.asarray(e.ids, dtype=np.int64) for e in self._encode(tok, [(cut(q), cut(p)) for q, p in texts])]
        short = self.info.max_seq_length + (0 if truncate else 1)
        for i, (q, p) in enumerate(texts):
            if max(len(q), len(p)) > budget and len(ids[i]) < short:
                ids[i] = np.asarray(self._encode(tok, [(q, p)])[0].ids, dtype=np.int64)
        return Tokenized(ids)

    def scores_sync(self, pairs: list[Pair]) -> np.ndarray:
        """Raw scores ``(n,)`` float32 of ``pairs`` in one batch on the calling thread (warm-up, canary, tests)."""
        return self.run(*self.pad(self.tokenize(pairs).ids))[:, 0]

    def embed_sync(self, texts: list[str], normalize: bool = True, dimensions: int | None = None) -> np.ndarray:
        """Not served: a reranker scores pairs (:meth:`scores_sync`).

        Raises:
            WrongModelTask: always.
        """
        raise WrongModelTask(self.info.name, "reranker", "embedding")

    def warm_up(self, batch_size: int = 8) -> float:
        """Score a short and a ``max_seq_length`` batch once, then check the canary; returns the seconds it took.

        Raises:
            ModelLoadError: inference failed, non-finite scores, or the canary does not match.
        """
        t0 = time.perf_counter()
        long = "warm " * (self.info.max_seq_length * 2)
        for pairs in ([("warm up", "warm up")] * batch_size, [(long, long)] * 2):
            try:
                s = self.scores_sync(pairs)
            except Exception as err:
                raise ModelLoadError(f"{self.path}: warm-up inference failed: {type(err).__name__}: {err}") from err
            if not np.isfinite(s).all():
                raise ModelLoadError(f"{self.path}: warm-up produced non-finite scores")
        self.check_canary()
        return time.perf_counter() - t0

    def check_canary(self) -> float | None:
        """Re-score the manifest's canary pairs (``canary.queries[i]``, ``canary.sentences[i]``); returns the max abs
        diff of the raw scores (None: no canary).

        Raises:
            ModelLoadError: a difference above ``canary.atol`` or non-finite scores.
        """
        c = self.manifest.canary
        if c is None:
            return None
        got = self.scores_sync(list(zip(c.queries or [], c.sentences)))
        want = np.asarray(c.embeddings, dtype=np.float32)[:, 0]
        diff = float(np.abs(got - want).max()) if np.isfinite(got).all() else float("inf")
        if not diff <= c.atol:
            raise ModelLoadError(f"{self.path}: canary mismatch: max abs score diff {diff:.3g} > atol {c.atol}")
        return diff


def open_model(artifact_dir: str | os.PathLike, **kwargs) -> OnnxModel:
    """:class:`OnnxReranker` for an artifact whose manifest says ``task: "reranker"``, else :class:`OnnxModel`
    (``kwargs``: theirs). Raises ModelLoadError as they do (an unreadable manifest included)."""
    try:
        rerank = load_manifest(Path(artifact_dir)).is_reranker
    except Exception as e:  # ArtifactError: the constructor says it again, with the rest of its checks
        raise ModelLoadError(str(e)) from e
    return (OnnxReranker if rerank else OnnxModel)(artifact_dir, **kwargs)
