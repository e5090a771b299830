"""Reranker pair tokenization (service.inference.onnx_reranker): the ids of every (query, passage) pair are those of
the whole pair tokenized then truncated by the artifact's own tokenizer (longest first), while a long passage is read
only up to about ``PASSAGE_CHARS_PER_TOKEN x max_seq_length`` characters and a request's shared query once. Real
SciFact claims and abstracts, and texts made to defeat a character cut (no spaces, runs of spaces, combining marks,
CJK, long queries)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from service.inference.onnx_reranker import PASSAGE_CHARS_PER_TOKEN, OnnxReranker
from training.data.scifact import load_scifact


@pytest.fixture(scope="module")
def pairs_data() -> tuple[list[str], list[str]]:
    data = load_scifact(max_queries=16, max_corpus=200, seed=0)
    return [data.queries[q] for q in sorted(data.qrels)], list(data.corpus.values())


@pytest.fixture(scope="module", params=[128, 256])
def reranker(request, reranker_artifact: Path, tmp_path_factory) -> OnnxReranker:
    """The tiny reranker at its own ``max_seq_length`` (128) and on a copy whose manifest says 256."""
    path = reranker_artifact
    if request.param != json.loads((path / "manifest.json").read_text())["max_seq_length"]:
        path = tmp_path_factory.mktemp("rr") / "rr"
        shutil.copytree(reranker_artifact, path)
        m = json.loads((path / "manifest.json").read_text())
        (path / "manifest.json").write_text(json.dumps({**m, "max_seq_length": request.param}))
    return OnnxReranker(path, providers=["CPUExecutionProvider"], intra_op_threads=1, inter_op_threads=1)


ADVERSARIAL = [
    "x" * 3000,  # one word: no space to cut at
    "漢字" * 1000,  # CJK: BERT splits every character, no spaces
    ("a" * 50 + " ") * 60,
    (" " * 7 + "word") * 300,  # runs of spaces
    "e\u0301 " * 1000,  # combining marks
    "\u200b " * 1500 + "the passage after zero-width spaces",  # characters that make no token, then words
    "[SEP] " * 400,
    "tab\tseparated " * 200,
    "a b " * 1000,  # ~1 character a token: the cut keeps too few tokens, the pair is tokenized whole
]


def _reference(reranker: OnnxReranker, pairs: list[tuple[str, str]], direction: str = "right") -> list[list[int]]:
    """The ids of the whole pairs, tokenized then truncated (longest first) by the artifact's tokenizer."""
    tok = Tokenizer.from_file(str(reranker.path / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(reranker.info.max_seq_length, direction=direction)
    return [e.ids for e in tok.encode_batch(pairs)]


class _Reading:
    """A tokenizer proxy counting the characters it is given to encode."""

    def __init__(self, tok) -> None:
        self._tok, self.chars = tok, 0

    def __getattr__(self, name):
        attr = getattr(self._tok, name)
        if name.startswith("encode"):

            def encode(texts, *args, **kwargs):
                self.chars += sum(len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts)
                return attr(texts, *args, **kwargs)

            return encode
        return attr


def test_ids_equal_the_whole_pair_tokenized_then_truncated(reranker, pairs_data):
    claims, abstracts = pairs_data
    """Right truncation (the way that cuts passages; left truncation and ``truncate=False`` tokenize whole pairs)."""
    queries = [*claims[:4], " ".join(claims), abstracts[0], "q"]  # longer than most passages; one token
    rng = np.random.default_rng(0)
    pairs = [(q, p) for q in queries for p in [abstracts[i] for i in rng.choice(len(abstracts), 30)] + ADVERSARIAL]
    got = reranker.tokenize(pairs).ids
    assert [g.tolist() for g in got] == _reference(reranker, pairs)


def test_a_long_passage_is_read_only_to_its_cut(reranker, pairs_data):
    """Ten pairs of one claim and a ~40,000-character passage of abstracts: the tokenizer reads the claim once and
    at most ``PASSAGE_CHARS_PER_TOKEN x max_seq_length`` characters of each passage (it read each passage up to
    ``100 x max_seq_length`` characters, and the claim ten times), and the ids are the whole pairs'."""
    claims, abstracts = pairs_data
    long = " ".join(abstracts[:30])
    assert len(long) > 100 * reranker.info.max_seq_length
    pairs = [(claims[0], long[i:]) for i in range(10)]
    tokenizers = {n: _Reading(getattr(reranker, n)) for n in ("_tok_full", "_tok_trunc", "_tok_left")}
    try:
        for n, t in tokenizers.items():
            setattr(reranker, n, t)
        got = reranker.tokenize(pairs).ids
    finally:
        for n, t in tokenizers.items():
            setattr(reranker, n, t._tok)
    read = sum(t.chars for t in tokenizers.values())
    assert read <= len(claims[0]) + 10 * PASSAGE_CHARS_PER_TOKEN * reranker.info.max_seq_length
    assert [g.tolist() for g in got] == _reference(reranker, pairs)
