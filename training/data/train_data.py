"""Training data: unsupervised sentences, supervised (anchor, positive, hard negative) triplets, positive pairs,
and the batches a run draws from them (:class:`TrainingData`).

* Unsupervised: a text file, one sentence a line (``../shared/data/corpus/en_sentences.txt``); the two views of
  a sentence are two dropout passes (SimCSE, Gao et al., arXiv:2104.08821, §3).
* Supervised (SimCSE §4.2): triplets (premise, entailment hypothesis,
  contradiction hypothesis of the same premise) from SentEval's SNLI files
  (``s1.*``, ``s2.*``, ``labels.*``), or a CSV with columns ``sent0, sent1, hard_neg``.
* Pairs: ``sentence<TAB>positive`` lines (e.g. back-translations, MSSE §3.1).
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Literal

import numpy as np

Mode = Literal["unsup", "sup", "pairs", "retrieval"]


def read_lines(path: str | Path) -> list[str]:
    """Non-empty stripped lines of a UTF-8 text file (possibly none).

    Raises:
        FileNotFoundError: no such file.
    """
    return [l.strip() for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]


def load_sentences(path: str | Path, max_samples: int | None = None) -> list[str]:
    """Non-empty stripped lines of a UTF-8 text file (first ``max_samples`` if given).

    Raises:
        FileNotFoundError: no such file. ValueError: the file has no sentence.
    """
    p = Path(path)
    out = []
    with open(p, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if s:
                out.append(s)
                if max_samples and len(out) >= max_samples:
                    break
    if not out:
        raise ValueError(f"{p}: no sentences")
    return out


def load_snli_triplets(snli_dir: str | Path, splits: tuple[str, ...] = ("dev", "test")) -> list[tuple[str, str, str]]:
    """(premise, entailment, contradiction) triplets from SentEval's SNLI files.

    For each premise, every entailment hypothesis is paired with a contradiction hypothesis of the
    same premise (the i-th entailment with the (i mod n)-th contradiction), so each entailment is
    used once. Premises lacking either label are skipped.

    Raises:
        FileNotFoundError: a split's ``s1``/``s2``/``labels`` file is missing. ValueError: no triplet.
    """
    d = Path(snli_dir)
    by_premise: dict[str, dict[str, list[str]]] = defaultdict(lambda: {"entailment": [], "contradiction": []})
    order: list[str] = []
    for split in splits:
        s1 = (d / f"s1.{split}").read_text(encoding="utf-8").splitlines()
        s2 = (d / f"s2.{split}").read_text(encoding="utf-8").splitlines()
        lab = (d / f"labels.{split}").read_text(encoding="utf-8").splitlines()
        for p, h, l in zip(s1, s2, lab):
            l = l.strip()
            if l in ("entailment", "contradiction"):
                p = p.strip()
                if p not in by_premise:
                    order.append(p)
                by_premise[p][l].append(h.strip())
    out = []
    for p in order:
        ent, con = by_premise[p]["entailment"], by_premise[p]["contradiction"]
        if ent and con:
            out.extend((p, e, con[i % len(con)]) for i, e in enumerate(ent))
    if not out:
        raise ValueError(f"{d}: no (premise, entailment, contradiction) triplet")
    return out


def load_csv_triplets(path: str | Path) -> list[tuple[str, str, str]]:
    """Triplets from a CSV with header columns ``sent0, sent1, hard_neg``.

    Raises:
        ValueError: a column is missing or the file has no row.
    """
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = {"sent0", "sent1", "hard_neg"} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)} (need sent0, sent1, hard_neg)")
        out = [(r["sent0"], r["sent1"], r["hard_neg"]) for r in reader]
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def load_triplets(path: str | Path) -> list[tuple[str, str, str]]:
    """A SNLI directory or a ``.csv`` triplet file (see the two loaders)."""
    p = Path(path)
    return load_snli_triplets(p) if p.is_dir() else load_csv_triplets(p)


def read_pairs(path: str | Path) -> tuple[list[str], list[str]]:
    """A positives file: one ``sentence<TAB>positive`` per line (e.g. a back-translation).

    Blank lines are skipped.

    Raises:
        ValueError: a non-blank line without exactly one tab-separated positive (message gives the line number).
        FileNotFoundError: ``path`` does not exist.
    """
    a, b = [], []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise ValueError(f"{path}:{n}: expected 'sentence<TAB>positive'")
        a.append(parts[0].strip())
        b.append(parts[1].strip())
    return a, b


class TrainingData:
    """The examples of a training run and its batches: a seeded permutation per epoch, drop-last, so the batch of
    a step depends only on (seed, step) and a resumed run sees the same batches.

    Args:
        mode: ``unsup`` (sentences), ``sup`` (triplets from :func:`load_triplets`), ``pairs`` (:func:`read_pairs`)
            or ``retrieval`` (the ``examples`` given: (query, passage, hard negative) triplets,
            :class:`training.retrieval.RetrievalTask`).
        train_file: the file (or SNLI directory) to read (not read in ``retrieval`` mode).
        max_samples: keep the first N examples (None: all).
        batch_size: examples per step.
        seed: of the per-epoch permutations.
        examples: ``retrieval`` mode's triplets.

    Raises:
        ValueError: fewer examples than ``batch_size``, or a malformed file. FileNotFoundError: no such file.
    """

    def __init__(
        self,
        mode: Mode,
        train_file: str | Path,
        max_samples: int | None,
        batch_size: int,
        seed: int,
        examples: list | None = None,
    ):
        self.mode, self.batch_size, self.seed = mode, batch_size, seed
        if mode == "retrieval":
            self.examples = list(examples or [])[: max_samples or None]
        elif mode == "sup":
            self.examples: list = load_triplets(train_file)[: max_samples or None]
        elif mode == "pairs":
            self.examples = list(zip(*read_pairs(train_file)))[: max_samples or None]
        else:
            self.examples = load_sentences(train_file, max_samples)
        self.steps_per_epoch = len(self.examples) // batch_size
        if self.steps_per_epoch < 1:
            raise ValueError(f"batch_size {batch_size} is larger than the data ({len(self.examples)} examples)")

    def __len__(self) -> int:
        return len(self.examples)

    def batch(self, step: int) -> list:
        """The examples of ``step``: position ``step mod steps_per_epoch`` of epoch ``step // steps_per_epoch``."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        B = self.batch_size
        return [self.examples[i] for i in perm[pos * B : (pos + 1) * B]]

    def views(self, items: list) -> dict[str, list[str]]:
        """The texts of each view of a batch: ``anchor`` and ``positive`` (the same sentences in ``unsup`` mode:
        dropout makes them differ), plus ``hard_negative`` in ``sup`` and ``retrieval`` modes."""
        if self.mode in ("sup", "retrieval"):
            return {
                "anchor": [t[0] for t in items],
                "positive": [t[1] for t in items],
                "hard_negative": [t[2] for t in items],
            }
        if self.mode == "pairs":
            return {"anchor": [t[0] for t in items], "positive": [t[1] for t in items]}
        return {"anchor": list(items), "positive": list(items)}

    def sentences(self) -> list[str]:
        """Every sentence of the examples, in order (the corpus the 3R pool is mined from)."""
        if self.mode == "unsup":
            return list(self.examples)
        return [s for ex in self.examples for s in ex]
