"""The 3R redundant-sentence pool (the 3R paper, §3.1): mined from the training corpus, or a user's file.

The paper has an LLM write 64 sentences from the corpus's 300 most frequent words, each word used at least twice.
No LLM runs here: :func:`mine_redundant_pool` picks such sentences from the corpus itself (a greedy set cover of
the top words; see its docstring). :func:`redundant_pool` is what a training run uses: the copy saved in its
output directory (resume), else the user's pool file, else the miner; it writes the pool, the top words and the
mining statistics to the output directory.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from training.data.train_data import read_lines

POOL_FILE = "redundant_pool.txt"
TOP_WORDS_FILE = "top_words.txt"

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words(sentence: str) -> list[str]:
    """Lower-cased alphabetic words of a sentence (the unit of the frequency count)."""
    return _WORD.findall(sentence.lower())


def top_words(sentences: Iterable[str], n: int = 300) -> list[str]:
    """The ``n`` most frequent words of a corpus (the 3R paper §3.1 step 1), most frequent first."""
    c: Counter[str] = Counter()
    for s in sentences:
        c.update(words(s))
    return [w for w, _ in c.most_common(n)]


def mine_redundant_pool(
    sentences: Sequence[str],
    n_top_words: int = 300,
    pool_size: int = 64,
    max_tokens: int = 32,
    min_top_fraction: float = 0.8,
    min_uses: int = 2,
    seed: int = 0,
    count_tokens: Callable[[str], int] | None = None,
) -> tuple[list[str], list[str], dict]:
    """Mine a redundant-sentence pool from a corpus (replaces the paper's LLM, §3.1 steps 2–3).

    Candidates: sentences with at most ``max_tokens`` tokens (``count_tokens``; default: word
    count) whose words are at least ``min_top_fraction`` top-``n_top_words`` words. A greedy set
    cover then picks, ``pool_size`` times, the candidate covering the most still-needed top-word
    uses (each top word is needed ``min_uses`` times; ties broken at random with ``seed``). Once
    every top word is covered, the rest of the pool is filled with the candidates of highest
    top-word fraction. If ``pool_size`` is too small to cover every word, coverage is partial
    and reported.

    Returns:
        ``(pool, top, stats)``: the pool sentences, the top words, and
        ``{"n_candidates", "covered_words", "fully_covered", "mean_top_fraction"}``.

    Raises:
        ValueError: no sentence qualifies as a candidate.
    """
    top = top_words(sentences, n_top_words)
    top_idx = {w: i for i, w in enumerate(top)}
    rng = np.random.default_rng(seed)
    cands: list[tuple[str, np.ndarray, float]] = []
    seen: set[str] = set()
    for s in sentences:
        ws = words(s)
        if not ws or s in seen:
            continue
        if len(ws) > max_tokens:
            continue
        ids = [top_idx[w] for w in ws if w in top_idx]
        frac = len(ids) / len(ws)
        if frac < min_top_fraction:
            continue
        if (count_tokens(s) if count_tokens else len(s.split())) > max_tokens:
            continue
        seen.add(s)
        cands.append((s, np.bincount(ids, minlength=len(top)) if ids else np.zeros(len(top), int), frac))
    if not cands:
        raise ValueError("no candidate sentence for the redundant pool: relax max_tokens/min_top_fraction")
    counts = np.stack([c[1] for c in cands])  # (n_cand, n_top)
    need = np.full(len(top), min_uses)
    chosen: list[int] = []
    available = np.ones(len(cands), bool)
    while len(chosen) < min(pool_size, len(cands)) and need.max() > 0:
        gain = np.minimum(counts, need).sum(1).astype(float)
        gain[~available] = -1
        best = np.flatnonzero(gain == gain.max())
        if gain.max() <= 0:
            break
        i = int(rng.choice(best))
        chosen.append(i)
        available[i] = False
        need = np.maximum(need - counts[i], 0)
    if len(chosen) < pool_size:
        fracs = np.array([c[2] for c in cands])
        fracs = fracs + rng.random(len(fracs)) * 1e-6
        fracs[~available] = -1
        for i in np.argsort(-fracs)[: pool_size - len(chosen)]:
            if fracs[i] >= 0:
                chosen.append(int(i))
    pool = [cands[i][0] for i in chosen]
    covered = int(((min_uses - need) >= min_uses).sum())
    stats = {
        "n_candidates": len(cands),
        "covered_words": covered,
        "n_top_words": len(top),
        "fully_covered": bool(need.max() == 0),
        "mean_top_fraction": float(np.mean([cands[i][2] for i in chosen])),
    }
    return pool, top, stats


def redundant_pool(
    settings,
    corpus: Sequence[str],
    out_dir: Path,
    count_tokens: Callable[[str], int],
    *,
    seed: int,
    resume: bool,
) -> tuple[list[str], list[str]]:
    """The pool and top words of a training run.

    Order: the copy saved in ``out_dir`` (when ``resume``) > the user's ``settings.pool_file`` (top words still
    counted on ``corpus``) > :func:`mine_redundant_pool` on the first ``settings.pool_mine_max_sentences`` of
    ``corpus``. Writes ``redundant_pool.txt``, ``top_words.txt`` and ``pool_stats.json`` to ``out_dir``.

    Args:
        settings: a :class:`training.config.ThreeRConfig`.
        count_tokens: a sentence's length in tokens, special tokens included.

    Raises:
        FileNotFoundError: the pool file is missing. ValueError: no corpus sentence qualifies for the pool.
    """
    t = settings
    pool_path, top_path = out_dir / POOL_FILE, out_dir / TOP_WORDS_FILE
    if pool_path.is_file() and top_path.is_file() and resume:
        return read_lines(pool_path), read_lines(top_path)
    if t.pool_mine_max_sentences:
        corpus = corpus[: t.pool_mine_max_sentences]
    if t.pool_file:
        pool = read_lines(t.pool_file)
        top = top_words(corpus, t.n_top_words)
        stats = {"source": f"user file {t.pool_file}"}
    else:
        pool, top, stats = mine_redundant_pool(
            corpus, t.n_top_words, t.pool_size, t.pool_max_tokens, t.pool_min_top_fraction, 2, seed, count_tokens
        )
        stats["source"] = "mined from the training corpus"
    pool_path.write_text("\n".join(pool) + "\n", encoding="utf-8")
    top_path.write_text("\n".join(top) + "\n", encoding="utf-8")
    (out_dir / "pool_stats.json").write_text(json.dumps(stats, indent=2))
    return pool, top
