"""Alignment-and-uniformity importance scores for heads and FFN neurons (SparseCSE, SparseCSE §2.3).

``L_score = λ·L_alignment + (1 − λ)·L_uniformity`` (SparseCSE, the L_Score
equation of §2.3, λ = 0.5 by default), with

* ``L_alignment = log E_{(i,i+)} ‖h_i − h_i⁺‖²`` over positive pairs,
* ``L_uniformity = log E_{i≠j} exp(−2‖h_i − h_j‖²)`` over different sentences,

on L2-normalised sentence embeddings (Wang & Isola 2020). Importance
(Molchanov et al. 2017, the I_head / I_neuron equations of §2.3):
``I = E_D |∂L_score/∂ξ|`` for head masks ξ and ``E_D |∂L_score/∂ν|`` for neuron
masks ν, the expectation taken over batches.

Positive pairs (our choice; the paper leaves the data unspecified beyond
"a data distribution D"): STS-B **train** pairs with gold score ≥ 4.0 (of 5),
so neither STS-B dev (model selection) nor any test set is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from training.sparse.masks import StructuredMasks

__all__ = [
    "alignment_loss",
    "uniformity_loss",
    "score_loss",
    "positive_pairs",
    "Importance",
    "compute_importance",
]


def alignment_loss(h: torch.Tensor, h_pos: torch.Tensor, *, log: bool = True) -> torch.Tensor:
    """``log E_i ‖ĥ_i − ĥ_i⁺‖²`` on L2-normalised rows (SparseCSE §2.3, L_Alignment).

    Args:
        h, h_pos: ``(N, D)`` embeddings of positive pairs (normalised here).
        log: take the log as SparseCSE writes it (Wang & Isola use no log).
    Returns:
        scalar tensor (squared Euclidean units on the unit sphere, ``[0, 4]`` before the log).
    Raises:
        ValueError: shapes differ.
    """
    if h.shape != h_pos.shape:
        raise ValueError(f"shape mismatch {tuple(h.shape)} vs {tuple(h_pos.shape)}")
    a, b = F.normalize(h, dim=-1), F.normalize(h_pos, dim=-1)
    m = (a - b).pow(2).sum(-1).mean()
    return m.log() if log else m


def uniformity_loss(h: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """``log E_{i≠j} exp(−t‖ĥ_i − ĥ_j‖²)`` on L2-normalised rows (SparseCSE §2.3, L_Uniformity, t = 2).

    Args:
        h: ``(N, D)``, N ≥ 2.
    Returns:
        scalar tensor, ``≤ 0``.
    Raises:
        ValueError: fewer than 2 rows.
    """
    if h.shape[0] < 2:
        raise ValueError("uniformity needs at least 2 embeddings")
    z = F.normalize(h, dim=-1)
    sq = (2 - 2 * z @ z.T).clamp_min(0)  # ‖a−b‖² = 2 − 2cos on the unit sphere
    n = z.shape[0]
    off = ~torch.eye(n, dtype=torch.bool, device=z.device)
    return torch.logsumexp(-t * sq[off], dim=0) - torch.log(torch.tensor(float(off.sum()), device=z.device))


def score_loss(h: torch.Tensor, h_pos: torch.Tensor, lam: float = 0.5) -> torch.Tensor:
    """``L_score = λ·L_alignment(h, h⁺) + (1 − λ)·L_uniformity`` (SparseCSE §2.3).

    Uniformity is averaged over the two views, ``(U(h) + U(h⁺)) / 2``, as in
    Wang & Isola's reference code. ``h``, ``h_pos``: ``(N, D)``.
    """
    u = 0.5 * (uniformity_loss(h) + uniformity_loss(h_pos))
    return lam * alignment_loss(h, h_pos) + (1.0 - lam) * u


def positive_pairs(
    split: str = "train", min_score: float = 4.0, limit: int | None = None, seed: int = 0
) -> tuple[list[str], list[str]]:
    """STS-B pairs with gold ``≥ min_score`` (0–5 scale) as positives: ``(sent1, sent2)`` lists, in a seeded
    random order (``default_rng(seed)``), so the first batches mix the file's genres (captions, forum, news)
    instead of following its order (which would put all 512 pairs of 16 batches in captions and forum).

    Raises:
        ValueError: no pair passes the threshold.
    """
    import numpy as np

    from training.data.sts import load_stsb

    p = load_stsb(split)
    keep = [i for i, g in enumerate(p.scores) if g >= min_score]
    if not keep:
        raise ValueError(f"no STS-B {split} pairs with score >= {min_score}")
    keep = [keep[int(j)] for j in np.random.default_rng(seed).permutation(len(keep))]
    if limit is not None:
        keep = keep[:limit]
    return [p.sent1[i] for i in keep], [p.sent2[i] for i in keep]


@dataclass
class Importance:
    """Importance per layer: ``heads[l]`` shape ``(n_heads_l,)``, ``neurons[l]`` shape ``(d_ffn_l,)``; ``n_batches`` averaged."""

    heads: list[torch.Tensor]
    neurons: list[torch.Tensor]
    n_batches: int
    mean_score_loss: float

    def to_json(self) -> dict:
        """A JSON-ready dict: per-layer scores as float lists, ``n_batches``, ``mean_score_loss``."""
        return {
            "heads": [h.tolist() for h in self.heads],
            "neurons": [n.tolist() for n in self.neurons],
            "n_batches": self.n_batches,
            "mean_score_loss": self.mean_score_loss,
        }

    @classmethod
    def from_json(cls, d: dict) -> Importance:
        """The inverse of :meth:`to_json` (float32 tensors); ``KeyError`` when a key is missing."""
        return cls(
            [torch.tensor(h) for h in d["heads"]],
            [torch.tensor(n) for n in d["neurons"]],
            int(d["n_batches"]),
            float(d["mean_score_loss"]),
        )


def compute_importance(
    model: nn.Module,
    embed: Callable[[nn.Module, Sequence[str]], torch.Tensor],
    sent1: Sequence[str],
    sent2: Sequence[str],
    *,
    lam: float = 0.5,
    batch_size: int = 32,
    max_batches: int | None = None,
) -> Importance:
    """``E_D |∂L_score/∂ξ|`` and ``E_D |∂L_score/∂ν|`` over batches of positive pairs (SparseCSE §2.3).

    The model runs in eval mode (no dropout; the two sides of a pair are the
    two sentences) with all-ones masks attached; its own parameters get no
    gradient accumulated (``requires_grad`` is restored afterwards).

    Args:
        model: a BERT-style encoder (see :func:`~training.sparse.masks.find_bert_layers`).
        embed: ``embed(model, sentences) -> (n, D)`` pooled embeddings with autograd.
        sent1, sent2: positive pairs (same length).
        lam: λ of L_score.
        batch_size: pairs per batch (uniformity uses the batch's other sentences as negatives).
        max_batches: stop after this many batches (CPU budget).

    Raises:
        ValueError: ``sent1`` and ``sent2`` differ in length or are shorter than 2, or ``batch_size`` < 2 (a batch
            of one pair has no negatives: no batch would be scored).
    """
    if len(sent1) != len(sent2) or len(sent1) < 2:
        raise ValueError("need two equally long lists of at least 2 positive pairs")
    if batch_size < 2:
        raise ValueError(f"batch_size must be >= 2 (in-batch negatives), got {batch_size}")
    masks = StructuredMasks.for_model(model)
    was_training = model.training
    req = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    acc_h = [torch.zeros_like(m) for m in masks.head_masks]
    acc_n = [torch.zeros_like(m) for m in masks.ffn_masks]
    n_batches, tot = 0, 0.0
    try:
        with masks.applied(model):
            for start in range(0, len(sent1), batch_size):
                a, b = sent1[start : start + batch_size], sent2[start : start + batch_size]
                if len(a) < 2:
                    break
                masks.zero_grad(set_to_none=True)
                loss = score_loss(embed(model, a), embed(model, b), lam)
                loss.backward()
                for l in range(len(acc_h)):
                    acc_h[l] += masks.head_masks[l].grad.abs()
                    acc_n[l] += masks.ffn_masks[l].grad.abs()
                n_batches += 1
                tot += float(loss.detach())
                if max_batches is not None and n_batches >= max_batches:
                    break
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(req[n])
        model.train(was_training)
    return Importance(
        [h / n_batches for h in acc_h], [f / n_batches for f in acc_n], n_batches, tot / max(n_batches, 1)
    )
