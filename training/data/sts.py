"""STS benchmark loaders in SentEval's "all" setting (torch-free).

Data root: ``$SHARED_DATA_DIR`` if set, else ``../shared/data`` relative to the
repository root (see ``../shared/data/README.md`` for formats).

Pair counts: STS12 3108, STS13 1500, STS14 3750, STS15 3000, STS16 1186,
STS-B test 1379 (dev 1500), SICK-R test 4927.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]

STS_YEARS = {
    "STS12": ("STS12-en-test", ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"]),
    "STS13": ("STS13-en-test", ["FNWN", "headlines", "OnWN"]),
    "STS14": ("STS14-en-test", ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"]),
    "STS15": ("STS15-en-test", ["answers-forums", "answers-students", "belief", "headlines", "images"]),
    "STS16": ("STS16-en-test", ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"]),
}
#: The seven test tasks whose mean is the headline number, in reporting order.
TEST_TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]


@dataclass
class STSPairs:
    """Scored sentence pairs: ``sent1[i]``, ``sent2[i]`` with gold score ``scores[i]`` (0-5 or 1-5)."""

    name: str
    sent1: list[str]
    sent2: list[str]
    scores: np.ndarray  # (n,) float64

    def __len__(self) -> int:
        return len(self.scores)


def data_root() -> Path:
    """The shared data root, not checked: ``$SHARED_DATA_DIR`` or ``<repo>/../shared/data``."""
    return Path(os.environ.get("SHARED_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))


def default_corpus_file() -> str:
    """The 189k-sentence English corpus (one sentence per line) under :func:`data_root`; the default training text."""
    return str(data_root() / "corpus" / "en_sentences.txt")


def data_dir() -> Path:
    """The shared data root: ``$SHARED_DATA_DIR`` or ``<repo>/../shared/data``.

    Raises:
        FileNotFoundError: the directory does not exist.
    """
    d = data_root()
    if not d.is_dir():
        raise FileNotFoundError(f"data directory {d} not found; set SHARED_DATA_DIR")
    return d


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def load_sts_year(year: str, root: Path | None = None) -> STSPairs:
    """One STS12-16 year, all its subsets concatenated; unscored pairs are skipped."""
    folder, subsets = STS_YEARS[year]
    base = (root or data_dir()) / "sts" / folder
    s1, s2, gold = [], [], []
    for sub in subsets:
        inputs = _read_lines(base / f"STS.input.{sub}.txt")
        golds = _read_lines(base / f"STS.gs.{sub}.txt")
        for line, g in zip(inputs, golds):
            if not g.strip():
                continue
            a, b = line.split("\t")[:2]
            s1.append(a)
            s2.append(b)
            gold.append(float(g))
    return STSPairs(year, s1, s2, np.asarray(gold))


def load_stsb(split: str = "test", root: Path | None = None) -> STSPairs:
    """STS Benchmark ``train`` / ``dev`` / ``test`` (columns 5 and 6 are the sentences)."""
    path = (root or data_dir()) / "sts" / "STSBenchmark" / f"sts-{split}.csv"
    s1, s2, gold = [], [], []
    with open(path, encoding="utf-8") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(row) < 7:
                continue
            gold.append(float(row[4]))
            s1.append(row[5])
            s2.append(row[6])
    return STSPairs(f"STSBenchmark-{split}" if split != "test" else "STSBenchmark", s1, s2, np.asarray(gold))


def load_sickr(split: str = "test", root: Path | None = None) -> STSPairs:
    """SICK relatedness (``test`` = SICK_test_annotated.txt)."""
    fname = {"test": "SICK_test_annotated.txt", "train": "SICK_train.txt", "trial": "SICK_trial.txt"}[split]
    path = (root or data_dir()) / "sts" / "SICK" / fname
    s1, s2, gold = [], [], []
    lines = _read_lines(path)
    for line in lines[1:]:
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        s1.append(parts[1])
        s2.append(parts[2])
        gold.append(float(parts[3]))
    return STSPairs("SICKRelatedness", s1, s2, np.asarray(gold))


def load_task(task: str, root: Path | None = None) -> STSPairs:
    """Load one of :data:`TEST_TASKS` or ``STSBenchmark-dev``."""
    if task in STS_YEARS:
        return load_sts_year(task, root)
    if task == "STSBenchmark":
        return load_stsb("test", root)
    if task == "STSBenchmark-dev":
        return load_stsb("dev", root)
    if task == "SICKRelatedness":
        return load_sickr("test", root)
    raise KeyError(f"unknown STS task {task!r}; known: {TEST_TASKS + ['STSBenchmark-dev']}")


def cosine_spearman(emb1: np.ndarray, emb2: np.ndarray, gold: np.ndarray) -> float:
    """Spearman x100 between row-wise cosine similarity of ``emb1``/``emb2`` (n, d) and ``gold`` (n,)."""
    from scipy.stats import spearmanr

    a = emb1 / np.maximum(np.linalg.norm(emb1, axis=1, keepdims=True), 1e-12)
    b = emb2 / np.maximum(np.linalg.norm(emb2, axis=1, keepdims=True), 1e-12)
    cos = (a * b).sum(axis=1)
    return float(spearmanr(cos, gold).correlation * 100.0)
