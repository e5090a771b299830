"""Margin-MSE distillation for the cross-encoder (Hofstätter, Althammer, Schröder, Sertkan & Hanbury, "Improving
Efficient Neural Ranking Models with Cross-Architecture Knowledge Distillation", arXiv:2010.02666), with
sentence-transformers' ``MarginMSELoss`` as it ships.

Rows: one (claim, judged document ``p``, candidate ``n``) triplet for each judged document of a train claim and each
of its unjudged first-stage candidates (:func:`training.rerank_distill.teacher.candidates`): many mined pairs per
claim. The loss is ``mean((s(q, p) - s(q, n) - m)^2)`` over the batch, ``s`` the model's raw score (logit) and the
target margin

    m = (1 - w) * (t_p - t_n) / T + w * (y_p - y_n)

with ``t`` the teacher's fused first-stage scores, ``T`` the temperature (a scale), ``y`` the labels (so
``y_p - y_n`` = 1) and ``w`` the label weight. Mixing the targets is mixing the losses:
``(1 - w) * MSE(x, a) + w * MSE(x, b) = MSE(x, (1 - w) * a + w * b) + w * (1 - w) * mean((a - b)^2)``, the last
term without gradient, so the model's gradient is that of ``(1 - w) * Margin-MSE(teacher) + w * Margin-MSE(labels)``.
"""

from __future__ import annotations

from typing import Any

from training.data.scifact import SciFact
from training.rerank_distill.teacher import Candidates


def target_margin(t_p: float, t_n: float, y_p: float, y_n: float, weight: float, temperature: float) -> float:
    """``(1 - w) * (t_p - t_n) / T + w * (y_p - y_n)`` (module docstring)."""
    return (1.0 - weight) * (t_p - t_n) / temperature + weight * (y_p - y_n)


def margin_mse(
    model: Any, data: SciFact, cands: dict[str, Candidates], weight: float, temperature: float
) -> tuple[Any, dict[str, list]]:
    """``(MarginMSELoss(model), columns)``: columns ``query``, ``positive``, ``negative``, ``label`` (the target
    margin), one row per (claim, judged document, unjudged candidate), claims in ``cands``' order."""
    from sentence_transformers.cross_encoder.losses import MarginMSELoss

    rows: dict[str, list] = {"query": [], "positive": [], "negative": [], "label": []}
    for q, c in cands.items():
        pos = [j for j, y in enumerate(c.labels) if y > 0]
        neg = [j for j, y in enumerate(c.labels) if y == 0]
        for i in pos:
            for j in neg:
                rows["query"].append(data.queries[q])
                rows["positive"].append(data.corpus[c.docs[i]])
                rows["negative"].append(data.corpus[c.docs[j]])
                rows["label"].append(
                    target_margin(c.teacher[i], c.teacher[j], c.labels[i], c.labels[j], weight, temperature)
                )
    return MarginMSELoss(model), rows
