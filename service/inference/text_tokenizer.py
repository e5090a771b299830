"""An artifact's tokenizer as the service applies it, without the ONNX session: :class:`TextTokenizer`.

The core's :class:`~service.inference.onnx_encoder.OnnxModel` tokenizes with it, and so does a front process
(``service.front.tokenizing``) that hands token ids to the core: both load the artifact's ``tokenizer.json`` and cut
the same way, so the ids match (the core still uses them only for the model they were made for, by its sha256).
Thread-safe: its three ``tokenizers.Tokenizer`` never change state after loading (a tokenizer's truncation is its
state, hence one per kind of cut).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from artifact_contract import TOKENIZER_FILE

#: upper bound of characters one token covers (BERT's WordPiece turns words over 100 characters into [UNK])
CHARS_PER_TOKEN = 100


@dataclass
class Tokenized:
    """Token ids of one request's inputs, ``ids[i]`` an int64 array of shape ``(len_i,)`` (special tokens included)."""

    ids: list[np.ndarray]
    lengths: np.ndarray = field(init=False)  # (n,) int64

    def __post_init__(self) -> None:
        self.lengths = np.fromiter((len(x) for x in self.ids), dtype=np.int64, count=len(self.ids))


class TextTokenizer:
    """The tokenizer of an artifact directory, cutting inputs to ``max_seq_length`` tokens.

    Args:
        artifact_dir: directory holding ``tokenizer.json`` (the artifact contract's ``TOKENIZER_FILE``).
        max_seq_length: tokens an input is cut to, special tokens included (the manifest's ``max_seq_length``).

    Raises:
        ValueError: ``tokenizer.json`` cannot be loaded (the message names the file and why).
    """

    def __init__(self, artifact_dir: str | Path, max_seq_length: int) -> None:
        path = Path(artifact_dir) / TOKENIZER_FILE
        try:
            self.trunc, self.left, self.full = (Tokenizer.from_file(str(path)) for _ in range(3))
        except Exception as e:
            raise ValueError(f"cannot load {path}: {e}") from e
        self.max_seq_length = max_seq_length
        # Padding is done by the batcher (to the batch's longest input), never here.
        for tok in (self.trunc, self.left, self.full):
            tok.no_padding()
        self.trunc.enable_truncation(max_length=max_seq_length)  # keeps a text's start
        self.left.enable_truncation(max_length=max_seq_length, direction="left")  # its end; special tokens stay
        self.full.no_truncation()

    def tokenize(self, texts: list[str], truncate: bool = True, direction: str = "right") -> Tokenized:
        """Token ids for ``texts`` (no padding).

        With ``truncate=True`` each input is cut to ``max_seq_length`` tokens, keeping its start (``direction=
        "right"``) or its end (``"left"``; TEI's ``truncation_direction``); with ``truncate=False`` it is not (the
        caller rejects over-long inputs).

        Bounded work: a text longer than :attr:`char_budget` characters is cut to that many before tokenizing
        (no token of a WordPiece/BPE vocabulary spans more than ~100 characters, so the first ``max_seq_length``
        tokens are unchanged; with ``"left"`` the last characters are kept), so a 2 MB string of words costs what a
        max-length one does. A cut text that gave fewer tokens than a full input (``truncate``) or that still fits
        (``truncate=False``) is tokenized in full: characters that make no token (whitespace runs, zero-width and
        other format characters, combining marks) may have filled the budget, and its embedding and token count
        must be the whole text's.
        """
        budget = self.char_budget
        left = truncate and direction == "left"
        cut = [t if len(t) <= budget else t[-budget:] if left else t[:budget] for t in texts]
        tok = (self.left if left else self.trunc) if truncate else self.full
        ids = [np.asarray(e.ids, dtype=np.int64) for e in self.encode(tok, cut)]
        short = self.max_seq_length + (0 if truncate else 1)  # fewer ids than this: the cut may have lost some
        for i, t in enumerate(texts):
            if len(t) > budget and len(ids[i]) < short:
                ids[i] = np.asarray(self.encode(tok, [t])[0].ids, dtype=np.int64)
        return Tokenized(ids)

    def encodings(self, texts: list[str], add_special_tokens: bool = True) -> list:
        """The untruncated ``tokenizers.Encoding`` of each text (``ids``, ``tokens``, ``offsets`` in characters,
        ``special_tokens_mask``), special tokens added or not."""
        return self.full.encode_batch(texts, add_special_tokens=add_special_tokens)  # with offsets: not _fast

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each id list (``ids`` within :attr:`vocab_size`)."""
        return self.full.decode_batch(ids, skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""
        return self.full.get_vocab_size()

    @property
    def char_budget(self) -> int:
        """Characters of a text read by the tokenizer: ``CHARS_PER_TOKEN * max_seq_length``."""
        return CHARS_PER_TOKEN * self.max_seq_length

    @property
    def pad_id(self) -> int:
        """The id of ``[PAD]`` or ``<pad>``, else 0."""
        for tok in ("[PAD]", "<pad>"):
            i = self.trunc.token_to_id(tok)
            if i is not None:
                return int(i)
        return 0

    @staticmethod
    def encode(tok: Tokenizer, texts: list) -> list:
        """``tok``'s encodings of ``texts`` (strings or pairs), without offsets where the library can skip them."""
        return tok.encode_batch_fast(texts) if hasattr(tok, "encode_batch_fast") else tok.encode_batch(texts)
