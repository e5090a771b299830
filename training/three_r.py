"""3R: Redundant Representation Reduction (the 3R paper, §3, Eqs. 3–5, Table 3 variants).

Per training step:

1. h̄ (D,): the mean embedding of k sentences sampled from a *redundant pool* (§3.1),
   encoded without gradient (dropout off, same pooling and train-only head as the loss sees).
2. σ^d = population standard deviation of dimension d over the batch's N embeddings
   (Eq. 3; computed on the anchor view h_i, detached). S = {d : σ^d < c} (§3.2).
3. ĥ^d = h^d − h̄^d for d ∈ S, ĥ^d = h^d otherwise (Eq. 5), applied to every embedding the
   loss sees (h_i, h_i⁺, h_j⁺, h_j⁻), which then enter InfoNCE (Eq. 4).

The threshold c is a learnable scalar. The mask is hard in the forward pass, ``m_d = 1[σ^d < c]``; the paper
does not say how its gradient reaches c, so it is a straight-through estimator (``c_estimator``):

* ``identity`` (default): ∂m_d/∂c = 1, so ∂L/∂c = Σ_d ∂L/∂m_d (the plain straight-through estimator of
  Bengio, Léonard & Courville 2013, "Estimating or Propagating Gradients Through Stochastic Neurons",
  arXiv:1308.3432). It never vanishes, which the paper's Table 7 requires: c converges to 0.273 from
  inits of 1.0 and 0.00001, i.e. from outside the range of σ, where no dimension changes side.
* ``sigmoid``: the gradient of ``sigmoid((c − σ^d) / β)`` (β = ``surrogate_temperature``), so
  ∂L/∂c = Σ_d ∂L/∂m_d · sigmoid'((c − σ^d)/β) / β. It only moves c while some σ^d lies within a few β
  of c; from an init above every σ^d (c ~ U(0, 1) on a small raw encoder, σ in ~0.06–0.45) the float32
  sigmoid saturates to exactly 1 and c never moves (docs/results.md, "3R's threshold c on this encoder").

σ is treated as a statistic (no gradient).

Table 3 variants (``variant``):

* ``3r`` — the method above.
* ``dynamic_mask`` — ĥ^d = 0 for d ∈ S (no subtraction; h̄ unused, pool not encoded). When S holds every
  dimension (c above every σ^d, e.g. a draw of c ~ U(0, 1) on an encoder whose σ stays below 0.4), ĥ = 0 for
  every sentence: the InfoNCE is the constant log N and no parameter, c included, gets a gradient, so the run
  could never leave that point. :meth:`ThreeR.prepare` refuses it at the first step and warns if it is reached later.
  With the ``identity`` estimator c gets no gradient at all under this variant, whatever S: ∂L/∂c =
  −Σ_i Σ_d h_i^d ∂L/∂ĥ_i^d, where the masked dimensions contribute nothing (every view is 0 there, so a cosine's
  gradient is too) and the unmasked ones cancel (a cosine ignores the common scale of ĥ_i). So the variant
  needs the ``sigmoid`` estimator, which weights the dimensions near the threshold (or ``learn_c=False``), and
  c inside σ's range; the constructor refuses ``identity`` with a learnable c.
* ``overall_subtraction`` — ĥ = h − h̄ on all dimensions (no identification; c unused).
* ``token_subtraction`` — h̄ = mean embedding of the top-300 words themselves (each word
  encoded as a one-word sentence), instead of the redundant-sentence pool.
* ``static_identification`` — σ from the top-300 word embeddings instead of the batch
  (the same S for every batch between refreshes).

Word-based statistics (last two variants) are re-encoded every ``refresh_every`` steps.

Redundant pool: the paper has an LLM write 64 sentences from the corpus's top-300 words
(each used ≥ 2 times). No LLM runs here: :func:`training.data.redundant_pool.mine_redundant_pool` mines them
from the training corpus instead (see its docstring).

Inference: 3R is a *training-time* regulariser. The paper uses it "during the contrastive
fine-tuning process" (§3.3) and evaluates the fine-tuned SimCSE encoder like any SimCSE model
(Gao et al.'s evaluation code, §4.1); h̄ depends on a random pool sample and S on the batch,
neither of which exists for a single query at inference. So the exported encoder is the
plain fine-tuned encoder + pooling, with 3R off (no h̄, no c, no mask) — see ``docs/results.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

logger = logging.getLogger(__name__)

Variant = Literal["3r", "dynamic_mask", "overall_subtraction", "token_subtraction", "static_identification"]
VARIANTS: tuple[str, ...] = ("3r", "dynamic_mask", "overall_subtraction", "token_subtraction", "static_identification")

# ---------------------------------------------------------------------------------------
# Pure tensor functions (Eqs. 3 and 5), tested on hand-computed tensors.
# ---------------------------------------------------------------------------------------


def batch_sigma(h: torch.Tensor) -> torch.Tensor:
    """Eq. 3: population standard deviation per dimension, ``(N, D) -> (D,)`` (divides by N)."""
    return h.std(dim=0, unbiased=False)


def redundant_mask(
    sigma: torch.Tensor, c: torch.Tensor, surrogate_temperature: float = 0.02, estimator: str = "identity"
) -> torch.Tensor:
    """Straight-through mask of redundant dimensions S = {d : σ^d < c} (§3.2).

    Forward: ``1[σ^d < c]`` (float, ``(D,)``). Backward (``estimator``): ``identity`` gives ∂m_d/∂c = 1
    (arXiv:1308.3432); ``sigmoid`` gives the gradient of ``sigmoid((c − σ^d) / surrogate_temperature)`` with
    respect to c (and σ if it requires grad).

    Raises:
        ValueError: ``surrogate_temperature`` ≤ 0 or an unknown estimator.
    """
    if surrogate_temperature <= 0:
        raise ValueError("surrogate_temperature must be > 0")
    if estimator == "identity":
        hard = (sigma < c).to(c.dtype if c.is_floating_point() else sigma.dtype)
        return hard + (c - c.detach())
    if estimator != "sigmoid":
        raise ValueError(f"unknown c estimator {estimator!r}; one of ('identity', 'sigmoid')")
    soft = torch.sigmoid((c - sigma) / surrogate_temperature)
    hard = (sigma < c).to(soft.dtype)
    return hard + soft - soft.detach()


def reduce_redundancy(
    h: torch.Tensor, hbar: torch.Tensor, mask: torch.Tensor | None, mode: str = "subtract"
) -> torch.Tensor:
    """Eq. 5 and its Table-3 alternatives, ``(M, D) -> (M, D)``.

    mode ``subtract``: ĥ = h − mask ⊙ h̄ (3R, token subtraction, static identification);
    ``zero``: ĥ = h ⊙ (1 − mask) (dynamic mask); ``all``: ĥ = h − h̄ (overall subtraction, mask ignored).

    Raises:
        ValueError: unknown mode.
    """
    if mode == "subtract":
        return h - mask * hbar
    if mode == "zero":
        return h * (1.0 - mask)
    if mode == "all":
        return h - hbar
    raise ValueError(f"unknown 3R reduction mode {mode!r}")


@dataclass
class ThreeRStep:
    """This step's 3R statistics: h̄ ``(D,)`` (or None), σ ``(D,)``, and the mask ``(D,)`` (or None)."""

    hbar: torch.Tensor | None
    sigma: torch.Tensor | None
    mask: torch.Tensor | None
    mode: str

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        """Apply Eq. 5 (or the variant) to embeddings ``(M, D)``."""
        hbar = self.hbar if self.hbar is not None else torch.zeros_like(h[0])
        return reduce_redundancy(h, hbar.to(h.dtype), self.mask, self.mode)


class ThreeR(nn.Module):
    """The 3R module: holds the learnable threshold c, the pool and the variant.

    Args:
        pool: the redundant sentences (§3.1); may be empty for ``dynamic_mask``.
        top: the top-frequency words (used by ``token_subtraction`` / ``static_identification``).
        k: pool sentences sampled per step (paper: 6).
        c_init: initial threshold c (in the units of the embedding values), or ``"uniform"``: c ~ U(0, 1) drawn
            with ``seed`` (the paper's initialisation).
        learn_c: c trainable (straight-through); False keeps it fixed (paper Table 8).
        surrogate_temperature: β of the sigmoid surrogate (``c_estimator="sigmoid"`` only).
        c_estimator: how the hard mask's gradient reaches c, ``identity`` or ``sigmoid`` (module docstring).
        variant: one of :data:`VARIANTS`.
        refresh_every: steps between re-encoding the top words (word-based variants).
        seed: for the per-step pool sample (``default_rng([seed, step])``: resumable).

    Raises:
        ValueError: unknown variant or c estimator, k < 1, an empty pool/word list the variant needs, or
            ``dynamic_mask`` with a learnable c and the ``identity`` estimator (c would get no gradient).
    """

    def __init__(
        self,
        pool: Sequence[str],
        top: Sequence[str],
        *,
        k: int = 6,
        c_init: float | str = 0.16,
        learn_c: bool = True,
        surrogate_temperature: float = 0.02,
        c_estimator: str = "identity",
        variant: str = "3r",
        refresh_every: int = 10,
        seed: int = 0,
    ):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"unknown 3R variant {variant!r}; one of {VARIANTS}")
        if k < 1:
            raise ValueError("k must be >= 1")
        if c_estimator not in ("identity", "sigmoid"):
            raise ValueError(f"unknown c estimator {c_estimator!r}; one of ('identity', 'sigmoid')")
        if variant in ("3r", "overall_subtraction", "static_identification") and not pool:
            raise ValueError(f"3R variant {variant!r} needs a non-empty redundant pool")
        if variant == "dynamic_mask" and learn_c and c_estimator == "identity":
            raise ValueError(
                "3R dynamic_mask with c_estimator 'identity': c's gradient is exactly zero under this variant "
                "(training/three_r.py docstring); use c_estimator 'sigmoid', or learn_c false for a fixed threshold"
            )
        if variant in ("token_subtraction", "static_identification") and not top:
            raise ValueError(f"3R variant {variant!r} needs the top-frequency words")
        self.pool = list(pool)
        self.top = list(top)
        self.k = min(k, len(self.pool)) if self.pool else k
        self.variant = variant
        self.surrogate_temperature = surrogate_temperature
        self.c_estimator = c_estimator
        self.refresh_every = max(1, refresh_every)
        self.seed = seed
        if c_init == "uniform":
            c_init = float(torch.rand((), generator=torch.Generator().manual_seed(seed)))
        elif isinstance(c_init, str):
            raise ValueError(f"c_init must be a number or 'uniform', got {c_init!r}")
        self.c_init = float(c_init)
        self.c = nn.Parameter(torch.tensor(self.c_init), requires_grad=learn_c and variant != "overall_subtraction")
        self._word_emb: torch.Tensor | None = None
        self._word_emb_step = -1
        self.last_seconds = 0.0
        self._warned_all_masked = False

    @property
    def mode(self) -> str:
        """The :func:`reduce_redundancy` mode of the variant: ``zero`` (dynamic mask), ``all`` (overall subtraction),
        else ``subtract``."""
        return {"dynamic_mask": "zero", "overall_subtraction": "all"}.get(self.variant, "subtract")

    def sample_pool(self, step: int) -> list[str]:
        """The k pool sentences used at ``step`` (deterministic in seed and step)."""
        rng = np.random.default_rng([self.seed, step])
        idx = rng.choice(len(self.pool), size=self.k, replace=False)
        return [self.pool[i] for i in idx]

    def _word_embeddings(self, encoder, step: int) -> torch.Tensor:
        if self._word_emb is None or step - self._word_emb_step >= self.refresh_every:
            self._word_emb = encoder.encode_tensor(self.top, use_head=True)
            self._word_emb_step = step
        return self._word_emb

    def _all_masked(self, sigma: torch.Tensor, step: int) -> None:
        msg = (
            f"3R dynamic_mask at step {step}: all {sigma.numel()} dimensions have sigma < c (c = {float(self.c):.4g}, "
            f"max sigma = {float(sigma.max()):.4g}), so every embedding is zeroed: the InfoNCE is the constant log N "
            f"and no parameter, c included, gets a gradient. Start c inside sigma's range (three_r.c_init; here "
            f"{float(sigma.min()):.4g}-{float(sigma.max()):.4g})"
        )
        if step == 0:
            raise ValueError(msg)
        if not self._warned_all_masked:
            logger.warning(msg)
            self._warned_all_masked = True

    def prepare(self, encoder, anchor: torch.Tensor, step: int) -> ThreeRStep:
        """Compute this step's h̄, σ and mask.

        Args:
            encoder: the :class:`training.encoder.SentenceEncoder` (used without gradient).
            anchor: ``(N, D)`` the batch's anchor embeddings h_i (only their values are used).
            step: optimisation step (selects the pool sample).

        Raises:
            ValueError: ``dynamic_mask`` masks every dimension at step 0 (c above every σ^d: a point no gradient
                can leave, see the module docstring); reached at a later step it is logged as a warning instead.
        """
        t0 = time.perf_counter()
        hbar = sigma = None
        if self.variant in ("3r", "overall_subtraction", "static_identification"):
            hbar = encoder.encode_tensor(self.sample_pool(step), use_head=True).mean(0)
        elif self.variant == "token_subtraction":
            hbar = self._word_embeddings(encoder, step).mean(0)
        if self.variant == "static_identification":
            sigma = batch_sigma(self._word_embeddings(encoder, step))
        elif self.variant != "overall_subtraction":
            sigma = batch_sigma(anchor.detach().float())
        mask = None
        if sigma is not None:
            mask = redundant_mask(sigma.to(anchor.device), self.c, self.surrogate_temperature, self.c_estimator)
            if self.mode == "zero" and bool((mask.detach() > 0.5).all()):
                self._all_masked(sigma, step)
        self.last_seconds = time.perf_counter() - t0
        return ThreeRStep(hbar.to(anchor.device) if hbar is not None else None, sigma, mask, self.mode)
