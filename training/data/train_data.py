"""Training data: unsupervised sentences and supervised (anchor, positive, hard negative) triplets.

* Unsupervised: a text file, one sentence a line (``../shared/data/corpus/en_sentences.txt``).
* Supervised (SimCSE, Gao et al. 2021 §4.2): triplets (premise, entailment hypothesis,
  contradiction hypothesis of the same premise) from SentEval's SNLI files
  (``s1.*``, ``s2.*``, ``labels.*``), or a CSV with columns ``sent0, sent1, hard_neg``.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path


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
