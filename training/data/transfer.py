"""Loaders for SentEval's transfer tasks (``<data>/transfer/``; see the data README).

Conneau & Kiela, "SentEval: An Evaluation Toolkit for Universal Sentence Representations", arXiv:1803.05449.
Each loader returns a :class:`TransferTask`: single-sentence tasks fill ``sentences``; MRPC fills ``pairs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from training.data.sts import data_dir

#: reporting order, as in the papers' tables
TRANSFER_TASKS = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]


@dataclass
class TransferTask:
    """One task: texts, integer labels, and the split each example belongs to (``train``/``dev``/``test``;
    cross-validated tasks have only ``train``).

    ``sentences``: N strings, or ``pairs``: N ``(a, b)`` tuples (MRPC). ``labels``: int array of shape ``(N,)``.
    """

    name: str
    labels: np.ndarray
    split: np.ndarray
    sentences: list[str] = field(default_factory=list)
    pairs: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.labels)

    def texts(self) -> list[str]:
        """Every text to encode (both sides of a pair)."""
        return self.sentences or [s for p in self.pairs for s in p]


def _lines(path: Path, encoding: str = "utf-8") -> list[str]:
    with open(path, encoding=encoding, errors="replace") as f:
        return [s.strip() for s in f if s.strip()]


def _binary(name: str, pos: Path, neg: Path, encoding: str) -> TransferTask:
    p, n = _lines(pos, encoding), _lines(neg, encoding)
    labels = np.array([1] * len(p) + [0] * len(n))
    return TransferTask(name, labels, np.array(["train"] * len(labels)), sentences=p + n)


def load_transfer_task(name: str, root: Path | None = None) -> TransferTask:
    """Load one of :data:`TRANSFER_TASKS` from ``root`` (default ``<data>/transfer``).

    Raises:
        KeyError: unknown task. FileNotFoundError: its files are missing.
    """
    d = (root or data_dir() / "transfer").resolve()
    if name == "MR":
        return _binary(name, d / "MR/rt-polarity.pos", d / "MR/rt-polarity.neg", "latin-1")
    if name == "CR":
        return _binary(name, d / "CR/custrev.pos", d / "CR/custrev.neg", "utf-8")
    if name == "SUBJ":
        return _binary(name, d / "SUBJ/subj.objective", d / "SUBJ/subj.subjective", "latin-1")
    if name == "MPQA":
        return _binary(name, d / "MPQA/mpqa.pos", d / "MPQA/mpqa.neg", "utf-8")
    if name == "SST2":
        texts, labels, split = [], [], []
        for part in ("train", "dev", "test"):
            for line in _lines(d / f"SST/binary/sentiment-{part}"):
                text, label = line.rsplit("\t", 1)
                texts.append(text.strip())
                labels.append(int(label))
                split.append(part)
        return TransferTask(name, np.array(labels), np.array(split), sentences=texts)
    if name == "TREC":
        classes = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
        texts, labels, split = [], [], []
        for part, fname in (("train", "train_5500.label"), ("test", "TREC_10.label")):
            for line in _lines(d / "TREC" / fname, "latin-1"):
                label, text = line.split(" ", 1)
                texts.append(text.strip())
                labels.append(classes.index(label.split(":")[0]))
                split.append(part)
        return TransferTask(name, np.array(labels), np.array(split), sentences=texts)
    if name == "MRPC":
        pairs, labels, split = [], [], []
        for part in ("train", "test"):
            for line in _lines(d / f"MRPC/msr_paraphrase_{part}.txt", "utf-8-sig")[1:]:
                cols = line.split("\t")
                pairs.append((cols[3].strip(), cols[4].strip()))
                labels.append(int(cols[0]))
                split.append(part)
        return TransferTask(name, np.array(labels), np.array(split), pairs=pairs)
    raise KeyError(f"unknown transfer task {name!r}; known: {', '.join(TRANSFER_TASKS)}")
