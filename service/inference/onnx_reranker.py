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
from functools import cached_property
from pathlib import Path

import numpy as np

from artifact_contract import RERANK_OUTPUT_NAME, load_manifest
from service.inference.onnx_encoder import ModelLoadError, OnnxModel
from service.inference.text_tokenizer import Tokenized

Pair = tuple[str, str]

#: characters of a passage read per token of ``max_seq_length`` before its pair is tokenized (right truncation; the
#: cut is checked, and undone where it may change the pair's tokens: :meth:`OnnxReranker.tokenize`). English prose is
#: ~4.5 characters a token for a WordPiece vocabulary (SciFact abstracts: 4.5): 6 leaves 1 in 1,000 SciFact
#: (claim, abstract) pairs to tokenize again at 256 tokens, and reads 87 % of their characters.
PASSAGE_CHARS_PER_TOKEN = 6
#: pre-tokenizers that split a text at its spaces: the tokens of a text cut just before a space (after a non-space)
#: are the first tokens of the whole text's (Hugging Face tokenizers' components)
WORD_SPLITTERS = ("BertPreTokenizer", "Whitespace", "WhitespaceSplit", "ByteLevel", "Metaspace")
#: normalizers that map characters one by one (or a base character with its combining marks): a text cut before a
#: space normalizes to the start of the whole text's normalization
LOCAL_NORMALIZERS = ("NoneType", "BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents")


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
        :meth:`OnnxModel.tokenize` does for a text), and tokenized whole when the cut may have lost tokens.

        With ``direction="right"`` the sides are tokenized apart, as the tokenizer does for a pair (Hugging Face
        tokenizers: each sequence encoded alone, then ``post_process``: truncation, then the template's special
        tokens), so that a query shared by a request's pairs is tokenized once, and a passage is read only up to
        ~``PASSAGE_CHARS_PER_TOKEN x max_seq_length`` characters, cut just before a space (:meth:`_pairs_right`);
        the ids are the same as the whole pair's, tokenized then truncated."""
        if truncate and direction == "right" and self._word_split:
            return Tokenized(self._pairs_right(texts))
        return Tokenized(self._pairs_whole(texts, truncate, direction))

    @cached_property
    def _word_split(self) -> bool:
        """The tokenizer splits words at spaces and normalizes characters one by one (:data:`WORD_SPLITTERS`, a
        Metaspace one with ``split``, a ByteLevel one with its regex; :data:`LOCAL_NORMALIZERS`): the tokens of a text
        cut before a space are the first of the whole text's. Other tokenizers take the whole-pair way."""
        tok = self._tok_full
        pre, norm = tok.pre_tokenizer, type(tok.normalizer).__name__
        split = getattr(pre, "split", True) is not False and getattr(pre, "use_regex", True) is not False
        return type(pre).__name__ in WORD_SPLITTERS and split and norm in LOCAL_NORMALIZERS

    def _pairs_right(self, pairs: list[Pair]) -> list[np.ndarray]:
        """Ids of ``pairs`` truncated on the right (:meth:`tokenize`).

        A passage over ``C = PASSAGE_CHARS_PER_TOKEN x max_seq_length`` characters is cut at its last space after a
        non-space before ``C`` (and after ``C / 2``), and the cut is kept only where it cannot change the pair: with
        ``a`` query tokens, ``b`` tokens of the cut passage and ``M`` = ``max_seq_length`` less the pair's special
        tokens, longest-first truncation keeps the same passage tokens whatever the passage's length once ``b >= a``
        and ``a + b > M`` (tokenizers' ``TruncationStrategy::LongestFirst``: the longer side is cut first, to
        ``M - a``, or both to about ``M / 2``, the odd token to the longer side). Any other pair (a cut that fails
        that test, a passage with no such space, a query over :attr:`char_budget` characters) is tokenized whole
        (:meth:`_pairs_whole`)."""
        full, trunc = self._tok_full, self._tok_trunc
        cut_at = PASSAGE_CHARS_PER_TOKEN * self.info.max_seq_length
        room = self.info.max_seq_length - trunc.num_special_tokens_to_add(True)
        queries = list(dict.fromkeys(q for q, _ in pairs if len(q) <= self.char_budget))
        q_enc = dict(zip(queries, full.encode_batch_fast(queries, add_special_tokens=False)))
        cuts = [len(p) if len(p) <= cut_at else _cut_before_space(p, cut_at) for _, p in pairs]
        todo = [i for i, ((q, _), c) in enumerate(zip(pairs, cuts)) if c is not None and q in q_enc]
        p_enc = full.encode_batch_fast([pairs[i][1][: cuts[i]] for i in todo], add_special_tokens=False)
        ids: list = [None] * len(pairs)
        for i, pe in zip(todo, p_enc):
            p, qe = pairs[i][1], q_enc[pairs[i][0]]
            a, b = len(qe.ids), len(pe.ids)
            if cuts[i] == len(p) or (b >= a and a + b > room):
                ids[i] = np.asarray(trunc.post_process(qe, pe).ids, dtype=np.int64)
        redo = [i for i, x in enumerate(ids) if x is None]
        for i, x in zip(redo, self._pairs_whole([pairs[i] for i in redo], True, "right") if redo else []):
            ids[i] = x
        return ids

    def _pairs_whole(self, texts: list[Pair], truncate: bool, direction: str) -> list[np.ndarray]:
        """Ids of each pair tokenized as a pair, each side read up to :attr:`char_budget` characters and the pair
        tokenized again uncut when that cut may have lost tokens (:meth:`tokenize`)."""
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
        return ids

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


def _cut_before_space(text: str, limit: int) -> int | None:
    """The length of ``text``'s longest prefix of at most ``limit`` characters (and over ``limit / 2``) that ends
    with a non-space followed by a space, or None."""
    end = limit + 1
    while (end := text.rfind(" ", limit // 2, end)) > limit // 2:
        if not text[end - 1].isspace():
            return end
    return None


def open_model(artifact_dir: str | os.PathLike, **kwargs) -> OnnxModel:
    """:class:`OnnxReranker` for an artifact whose manifest says ``task: "reranker"``, else :class:`OnnxModel`
    (``kwargs``: theirs). Raises ModelLoadError as they do (an unreadable manifest included)."""
    try:
        rerank = load_manifest(Path(artifact_dir)).is_reranker
    except Exception as e:  # ArtifactError: the constructor says it again, with the rest of its checks
        raise ModelLoadError(str(e)) from e
    return (OnnxReranker if rerank else OnnxModel)(artifact_dir, **kwargs)
