"""SimCSE (Gao et al., 2021): InfoNCE over in-batch negatives, unsupervised and supervised.

the 3R paper (3R), Eq. 1 (unsupervised) and Eq. 2 (supervised with hard negatives);
with 3R the inputs are the reduced embeddings ĥ (Eq. 4).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.encoder import cosine_matrix
from training.objectives import register
from training.objectives.base import Objective, ObjectiveBatch, ObjectiveContext


def info_nce(
    anchor: torch.Tensor, positive: torch.Tensor, hard_negative: torch.Tensor | None = None, temperature: float = 0.05
) -> torch.Tensor:
    """InfoNCE with in-batch negatives, mean over the batch.

    Unsupervised (the 3R paper Eq. 1):
    ``L_i = -log exp(sim(h_i, h_i⁺)/τ) / Σ_j exp(sim(h_i, h_j⁺)/τ)``.
    Supervised (Eq. 2): the denominator also sums ``exp(sim(h_i, h_j⁻)/τ)`` over all j.
    ``sim`` is cosine similarity (:func:`training.encoder.cosine_matrix`).

    Args:
        anchor: ``(N, D)`` h_i. positive: ``(N, D)`` h_i⁺. hard_negative: ``(N, D)`` h_i⁻ or None.
        temperature: τ (> 0).

    Returns:
        Scalar tensor (nats).

    Raises:
        ValueError: shapes differ or temperature ≤ 0.
    """
    if anchor.shape != positive.shape or (hard_negative is not None and hard_negative.shape != anchor.shape):
        raise ValueError(
            f"shape mismatch: {tuple(anchor.shape)} {tuple(positive.shape)} "
            f"{None if hard_negative is None else tuple(hard_negative.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = cosine_matrix(anchor, positive)
    if hard_negative is not None:
        logits = torch.cat([logits, cosine_matrix(anchor, hard_negative)], dim=1)
    labels = torch.arange(anchor.shape[0], device=anchor.device)
    return F.cross_entropy(logits / temperature, labels)


@register("simcse")
class SimCSE(Objective):
    """SimCSE InfoNCE term. Uses ``batch.hard_negative`` when present (supervised, Eq. 2), else Eq. 1.

    Params: ``temperature`` (τ, default 0.05); ``use_hard_negative`` (default True: use them if the batch has them).
    """

    def __init__(self, ctx: ObjectiveContext, temperature: float = 0.05, use_hard_negative: bool = True):
        super().__init__(ctx)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.use_hard_negative = use_hard_negative

    def forward(self, batch: ObjectiveBatch) -> torch.Tensor:
        """SimCSE: :func:`info_nce` of ``batch.anchor`` against ``batch.positive`` (plus ``batch.hard_negative`` when
        present and ``use_hard_negative``) at τ = ``temperature``; a scalar in nats."""
        neg = batch.hard_negative if self.use_hard_negative else None
        return info_nce(batch.anchor, batch.positive, neg, self.temperature)
