"""Listwise distillation for the cross-encoder: the KL divergence from a target distribution over a claim's
candidates to the model's softmax over them, with sentence-transformers' ``ListNetLoss`` as it ships (ListNet: Cao,
Qin, Liu, Tsai & Li, "Learning to Rank: From Pairwise Approach to Listwise Approach", ICML 2007; the loss it
computes is the cross-entropy ``-sum p log softmax(s)``, which is ``KL(p || softmax(s))`` plus the target's entropy,
a constant: the same gradient).

Rows: one per train claim, its judged documents and its unjudged first-stage candidates
(:func:`training.rerank_distill.teacher.candidates`). The target

    p = (1 - w) * softmax(t / T) + w * y / sum(y)

mixes the teacher's fused first-stage scores ``t``, softened by the temperature ``T`` (Hinton, Vinyals & Dean,
"Distilling the Knowledge in a Neural Network", arXiv:1503.02531), with the labels ``y`` as a distribution (uniform
over the judged documents: the softmax cross-entropy with binary relevance of Bruch, Wang, Bendersky & Najork,
ICTIR 2019), by the label weight ``w``. The cross-entropy is linear in its target, so the loss is exactly
``(1 - w) * CE(teacher) + w * CE(labels)``. ``ListNetLoss`` applies a softmax to the labels it is given, so each row's
labels are ``log p`` (a zero probability floored at 1e-30).
"""

from __future__ import annotations

import math
from typing import Any

from training.data.scifact import SciFact
from training.rerank_distill.teacher import Candidates

FLOOR = 1e-30


def target_distribution(teacher: list[float], labels: list[float], weight: float, temperature: float) -> list[float]:
    """``p`` of the module docstring over one claim's candidates (sums to 1; a claim without a judged document
    gets the teacher's distribution alone)."""
    top = max(teacher)
    e = [math.exp((t - top) / temperature) for t in teacher]
    z = sum(e)
    pos = sum(labels)
    w = weight if pos > 0 else 0.0
    return [(1.0 - w) * x / z + (w * y / pos if pos > 0 else 0.0) for x, y in zip(e, labels)]


def listwise_kl(
    model: Any, data: SciFact, cands: dict[str, Candidates], weight: float, temperature: float
) -> tuple[Any, dict[str, list]]:
    """``(ListNetLoss(model), columns)``: columns ``query``, ``docs`` (a claim's candidate texts), ``labels``
    (``log p``, module docstring), one row per claim; every pair of a batch is scored in one forward pass."""
    from sentence_transformers.cross_encoder.losses import ListNetLoss

    rows: dict[str, list] = {"query": [], "docs": [], "labels": []}
    for q, c in cands.items():
        p = target_distribution(c.teacher, c.labels, weight, temperature)
        rows["query"].append(data.queries[q])
        rows["docs"].append([data.corpus[d] for d in c.docs])
        rows["labels"].append([math.log(max(x, FLOOR)) for x in p])
    return ListNetLoss(model, mini_batch_size=-1), rows
