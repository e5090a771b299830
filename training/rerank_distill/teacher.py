"""The distillation teacher: the first stage's own fused scores of each train claim's candidates.

:func:`teacher_run` is :func:`training.rerank_protocol.first_stage` on the train claims (the same computation as the
dev claims' first stage the model is chosen on, and the test claims' first stage it reranks: e.g. ``dbsf``, the
dense and BM25 top ``depth`` lists each normalised to ``(s - (mean - 3 sd)) / (6 sd)`` and summed, Qdrant's DBSF),
cached in a JSON file keyed by what decides it. :func:`candidates` turns it into each claim's training list.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from artifact_contract.fsio import atomic_write_text
from training.data.scifact import SciFact

log = logging.getLogger("training.rerank_distill")
#: ``{query id: [(doc id, fused first-stage score), ...]}``, best first (:data:`training.rerank_protocol.Run`)
Run = dict[str, list[tuple[str, float]]]


@dataclass
class Candidates:
    """One train claim's distillation list.

    Attributes:
        docs: document ids: the claim's judged documents (sorted), then its ``k`` best unjudged first-stage
            candidates (best first).
        teacher: the first stage's fused score of each (a judged document the first stage did not return: 0.0,
            what DBSF adds for a list that does not hold it).
        labels: 1.0 for a judged document, 0.0 for the others.
    """

    docs: list[str]
    teacher: list[float]
    labels: list[float]


def _key(data: SciFact, qids: Sequence[str], kind: str, depth: int, encoder, max_seq_length: int) -> dict:
    corpus = hashlib.sha256("\n".join(data.corpus).encode()).hexdigest()[:16]
    return {
        "teacher": kind,
        "depth": depth,
        "encoder": str(encoder) if encoder else None,
        "max_seq_length": max_seq_length,
        "corpus": f"{len(data.corpus)}:{corpus}",
        "queries": sorted(qids),
    }


def teacher_run(
    data: SciFact,
    qids: Sequence[str],
    kind: str = "dbsf",
    depth: int = 100,
    encoder: str | Path | None = None,
    max_seq_length: int = 256,
    cache: str | Path | None = None,
) -> Run:
    """The first stage ``kind`` of the claims ``qids`` (top ``depth`` over ``data.corpus``, bi-encoder ``encoder`` for
    the dense part, None: the default encoder), with its scores; read from ``cache`` when it holds the same key
    (kind, depth, encoder path, max length, the corpus' ids, the claims), else computed and written there (a change
    of the encoder's weights under the same path is not noticed: delete the file).

    Raises:
        ValueError: an unknown kind (:func:`training.rerank_protocol.first_stage`).
    """
    from training.rerank_protocol import first_stage

    key = _key(data, qids, kind, depth, encoder, max_seq_length)
    path = Path(cache) if cache else None
    if path is not None and path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            log.info("teacher scores from %s", path)
            return {q: [(d, float(s)) for d, s in hits] for q, hits in saved["run"].items()}
    run = first_stage(data, list(qids), kind, depth, encoder, max_seq_length)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"key": key, "run": run}))
        log.info("teacher scores (%s, %d claims) written to %s", kind, len(run), path)
    return run


def candidates(data: SciFact, run: Run, qids: Sequence[str], k: int) -> dict[str, Candidates]:
    """Each claim's judged documents and its ``k`` best unjudged candidates of ``run`` (fewer when the first stage
    returned fewer), with their teacher scores and labels (:class:`Candidates`).

    Raises:
        ValueError: ``k`` < 1.
    """
    if k < 1:
        raise ValueError(f"candidates per query must be at least 1, got {k}")
    out = {}
    for q in qids:
        score = dict(run.get(q, []))
        judged = sorted(data.qrels[q])
        rest = [d for d, _ in run.get(q, []) if d not in data.qrels[q]][:k]
        docs = judged + rest
        out[q] = Candidates(docs, [score.get(d, 0.0) for d in docs], [1.0] * len(judged) + [0.0] * len(rest))
    return out
