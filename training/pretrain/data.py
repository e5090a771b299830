"""Pretraining data: the held-out split, the WordPiece vocabulary, and deterministic batches.

Every random choice is a function of the run's seed (and the step), so a resumed run sees exactly the
batches and masks an uninterrupted one would have seen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers import AutoTokenizer, BertTokenizerFast, DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from training.st_dir import default_model_dir

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def split_heldout(sentences: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """A seeded random ``(train, heldout)`` split; ``heldout`` has ``max(1, round(fraction * n))`` sentences.

    Raises:
        ValueError: fewer than two sentences.
    """
    if len(sentences) < 2:
        raise ValueError("need at least two sentences to hold one out")
    order = np.random.default_rng(seed).permutation(len(sentences))
    n_held = min(len(sentences) - 1, max(1, round(fraction * len(sentences))))
    held = {int(i) for i in order[:n_held]}
    return [s for i, s in enumerate(sentences) if i not in held], [sentences[int(i)] for i in order[:n_held]]


def train_wordpiece(sentences: list[str], vocab_size: int, out_dir: Path) -> BertTokenizerFast:
    """Train an uncased BERT WordPiece vocabulary on ``sentences`` with ``tokenizers`` and save it in ``out_dir``.

    Returns the ``transformers`` tokenizer (``[CLS] ... [SEP]`` post-processing, lower-casing, accent stripping,
    as BERT-base-uncased).
    """
    from tokenizers import BertWordPieceTokenizer

    wp = BertWordPieceTokenizer(lowercase=True, strip_accents=True, clean_text=True)
    wp.train_from_iterator(sentences, vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS)
    out_dir.mkdir(parents=True, exist_ok=True)
    wp.save(str(out_dir / "wordpiece.json"))
    tok = BertTokenizerFast(
        tokenizer_file=str(out_dir / "wordpiece.json"),
        do_lower_case=True,
        **dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), SPECIAL_TOKENS)),
    )
    tok.save_pretrained(str(out_dir))
    return tok


def load_or_build_tokenizer(
    kind: str, init_from: str, sentences: list[str], vocab_size: int, out_dir: Path
) -> PreTrainedTokenizerBase:
    """The run's tokenizer: ``init_from``'s when continuing a model, the default encoder's for ``kind="default"``,
    else a WordPiece vocabulary trained on ``sentences`` (cached in ``out_dir``, so a resumed run reuses it).
    The default encoder's package is resolved only for ``kind="default"`` (a machine may lack it)."""
    if init_from:
        return AutoTokenizer.from_pretrained(init_from)
    if kind == "default":
        return AutoTokenizer.from_pretrained(str(default_model_dir()))
    if (out_dir / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(out_dir))
    return train_wordpiece(sentences, vocab_size, out_dir)


class MaskedBatches:
    """Deterministic MLM batches: sentence order is a seeded permutation per epoch, masks a seeded function of
    the step (``DataCollatorForLanguageModeling`` with ``seed = base_seed + step``).

    ``batch(step)`` returns ``{"input_ids", "attention_mask", "labels"}`` (int64, shape ``(B, T)``; ``labels`` is
    -100 except at the chosen tokens).
    """

    def __init__(
        self,
        sentences: list[str],
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        max_seq_length: int,
        mlm_probability: float,
        seed: int,
    ) -> None:
        self.sentences = sentences
        self.tokenizer = tokenizer
        self.batch_size = min(batch_size, len(sentences))
        self.max_seq_length = max_seq_length
        self.mlm_probability = mlm_probability
        self.seed = seed
        self._epoch = -1
        self._order: np.ndarray | None = None

    @property
    def steps_per_epoch(self) -> int:
        """Full batches per pass over the sentences (the remainder of each permutation is dropped)."""
        return len(self.sentences) // self.batch_size

    def sentences_at(self, step: int) -> list[str]:
        """The sentences of step ``step`` (0-based)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(len(self.sentences))
            self._epoch = epoch
        idx = self._order[i * self.batch_size : (i + 1) * self.batch_size]
        return [self.sentences[int(j)] for j in idx]

    def mask(self, sentences: list[str], seed: int) -> dict:
        """Tokenise (truncating to ``max_seq_length``), pad and mask ``sentences`` with masking seed ``seed``."""
        enc = self.tokenizer(sentences, truncation=True, max_length=self.max_seq_length)
        feats = [{"input_ids": ids} for ids in enc["input_ids"]]
        collator = DataCollatorForLanguageModeling(self.tokenizer, mlm_probability=self.mlm_probability, seed=seed)
        return dict(collator(feats))

    def batch(self, step: int) -> dict:
        """The masked batch of step ``step``."""
        return self.mask(self.sentences_at(step), self.seed + step)
