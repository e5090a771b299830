"""A reranker's pair scores kept on disk: :class:`PairScoreCache`.

Reranking several first stages of the same claims (dense, BM25, RRF, DBSF: ``python -m training rerank-eval
--first-stage dbsf,rrf,dense,bm25``) scores many of the same (claim, document) pairs again; a cross-encoder pair at
256 tokens costs tens of milliseconds on a 2-core CPU. The cache scores each distinct pair once, in chunks, and
writes the scores after each chunk, so an interrupted evaluation resumes where it stopped. It is tied to the model
(every file of its directory by size and mtime) and the pair's maximum length: another model or length starts empty.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from artifact_contract.fsio import atomic_write_json

PairScorer = Callable[[list[tuple[str, str]]], Sequence[float]]


def model_stamp(model: str | Path) -> dict[str, list[int]]:
    """``{file relative to model: [size in bytes, mtime in ns]}`` of every file under the directory ``model``."""
    root = Path(model)
    files = [f for f in sorted(root.rglob("*")) if f.is_file()]
    return {str(f.relative_to(root)): [f.stat().st_size, f.stat().st_mtime_ns] for f in files}


def pair_key(pair: tuple[str, str]) -> str:
    """A pair's key: the SHA-1 of its two texts joined by a NUL (texts, not ids: a slice keeps the same key)."""
    return hashlib.sha1(f"{pair[0]}\0{pair[1]}".encode()).hexdigest()


class PairScoreCache:
    """A memoising :data:`PairScorer` over ``scorer`` (module docstring).

    Args:
        scorer: the reranker's raw scores of a list of (claim, document) pairs.
        path: the JSON file (None: in memory only). inputs: what the scores depend on (:func:`model_stamp` of the
            model, the maximum length); a file made for other inputs is not read, and is replaced.
        chunk: pairs scored between two writes of the file.
    """

    def __init__(self, scorer: PairScorer, path: str | Path | None, inputs: dict[str, Any], chunk: int = 2048) -> None:
        self.scorer, self.path, self.chunk = scorer, Path(path) if path else None, chunk
        self.inputs = json.loads(json.dumps(inputs))
        self.scores: dict[str, float] = {}
        self.scored = 0  # pairs this object sent to the scorer
        if self.path and self.path.is_file():
            try:
                old = json.loads(self.path.read_text())
            except ValueError:
                old = {}
            if old.get("inputs") == self.inputs:
                self.scores = {k: float(v) for k, v in old.get("scores", {}).items()}

    def __call__(self, pairs: list[tuple[str, str]]) -> list[float]:
        """The score of each pair, the missing ones scored (each distinct pair once) and recorded."""
        keys = [pair_key(p) for p in pairs]
        todo: dict[str, tuple[str, str]] = {}
        for k, p in zip(keys, pairs):
            if k not in self.scores:
                todo.setdefault(k, p)
        items = list(todo.items())
        for i in range(0, len(items), self.chunk):
            part = items[i : i + self.chunk]
            for (k, _), s in zip(part, self.scorer([p for _, p in part])):
                self.scores[k] = float(s)
            self.scored += len(part)
            if self.path:
                atomic_write_json(self.path, {"inputs": self.inputs, "scores": self.scores}, indent=None)
        return [self.scores[k] for k in keys]
