"""The objective interface: how a loss term plugs into the trainer.

A training run is a **weighted sum of named loss terms** from the config::

    losses:
      simcse:   {type: simcse, weight: 1.0, params: {temperature: 0.05}}
      informin: {type: informin, weight: 1.0, params: {lam: 0.4}}

Each term is an :class:`Objective` (a small ``nn.Module``), ONE FILE PER METHOD in
``training/objectives/<type>.py``, registered with :func:`training.objectives.register`.
The registry imports ``training.objectives.<type>`` on first use, so adding a method is
adding one file: no other file needs editing.

Writing an objective
--------------------
::

    from training.objectives import register
    from training.objectives.base import Objective, ObjectiveBatch, ObjectiveContext

    @register("mymethod")
    class MyMethod(Objective):
        extra_layers = ()            # or e.g. (-2,) to get the penultimate layer pooled
        needs_token_states = False   # True: batch.token_states[view] (N, T, H)
        requires_hard_negative = False

        def __init__(self, ctx: ObjectiveContext, lam: float = 0.4):
            super().__init__(ctx)
            self.lam = lam          # config ``params`` arrive as keyword arguments

        def forward(self, batch: ObjectiveBatch):
            return self.lam * (batch.anchor - batch.positive).pow(2).sum(-1).mean()
            # or a dict of named sub-terms {"rec": ..., "mlm": ...} (summed; each logged)

The trainer calls ``objective(batch)`` once per optimisation step and adds
``weight * loss`` to the total. Each term (and each sub-term) is logged as
``loss/<name>`` (``loss/<name>/<sub>``) in ``metrics.jsonl``.

What an objective receives (:class:`ObjectiveBatch`)
----------------------------------------------------
* ``anchor`` ``(N, D)``: h_i, ``positive`` ``(N, D)``: h_i⁺, ``hard_negative`` ``(N, D)`` or
  ``None``: h_i⁻ — pooled (+ train-only head) sentence embeddings, float32, **already
  transformed by 3R** when 3R is enabled (the 3R paper, Eq. 5: every embedding the loss sees).
  Unsupervised: ``anchor``/``positive`` are two dropout views of the same sentences.
  Supervised: anchor = premise, positive = entailment, hard_negative = contradiction.
* ``raw``: the same views before 3R, ``{"anchor", "positive", "hard_negative"?}``.
* ``layers``: ``{view: {layer: (N, D)}}`` pooled intermediate layers for the layers in
  ``extra_layers`` (HF ``hidden_states`` indexing, negative from the end), **not**
  3R-transformed: call ``batch.transform(x)`` to apply this step's 3R to them
  (e.g. SSCL's intermediate-layer negative).
* ``token_states``: ``{view: (N, T, H)}`` last hidden states, if ``needs_token_states``.
* ``input_ids`` / ``attention_mask``: ``{view: (N, T)}`` int64 token ids (e.g. MSSE's decoder targets).
* ``transform``: ``(M, D) -> (M, D)``, this step's 3R transform (identity when 3R is off);
  it uses this step's σ, S and h̄ and passes gradient to the learnable threshold c.
* ``encoder``: the :class:`training.encoder.SentenceEncoder` (``encoder.word_embeddings``
  for tied output layers). An extra encoder forward with gradient inside an objective
  (e.g. an MLM pass) is allowed: its gradient goes straight to the parameters, also under
  gradient caching, but it is not chunked (its memory is the full batch's) and its dropout
  masks are its own. Parameters of the objective itself (decoders, heads) train normally.
* ``step``: the optimisation step (0-based).

Train-only parameters of an objective are saved in the training checkpoint, never in
the exported model.

Gradient caching: the trainer may compute the embeddings in chunks without gradient,
call the objectives on detached leaf copies, backpropagate to those copies and then
re-encode chunk by chunk (Gao et al., 2021, "Scaling deep contrastive learning batch
size under memory limited setup"). Objectives need do nothing for this, as long as all
their gradient to the encoder flows through the tensors of :class:`ObjectiveBatch`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

LossOutput = torch.Tensor | dict[str, torch.Tensor]


@dataclass
class ObjectiveContext:
    """Static facts an objective may need at construction.

    Attributes:
        hidden_size: D, the sentence-embedding size.
        num_layers: number of transformer layers of the encoder.
        vocab_size: tokenizer vocabulary size.
        pad_token_id: padding id (for masking reconstruction targets).
        encoder: the :class:`training.encoder.SentenceEncoder` being trained.
        supervised: whether batches carry hard negatives.
    """

    hidden_size: int
    num_layers: int
    vocab_size: int
    pad_token_id: int
    encoder: Any = None
    supervised: bool = False


@dataclass
class ObjectiveBatch:
    """One step's inputs to every objective (see the module docstring). Shapes: N sentences, D dims."""

    anchor: torch.Tensor
    positive: torch.Tensor
    hard_negative: torch.Tensor | None = None
    raw: dict[str, torch.Tensor] = field(default_factory=dict)
    layers: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    token_states: dict[str, torch.Tensor] = field(default_factory=dict)
    input_ids: dict[str, torch.Tensor] = field(default_factory=dict)
    attention_mask: dict[str, torch.Tensor] = field(default_factory=dict)
    transform: Callable[[torch.Tensor], torch.Tensor] = lambda x: x
    encoder: Any = None
    step: int = 0


class Objective(nn.Module, abc.ABC):
    """Base class of a loss term (see the module docstring for the full contract).

    Class attributes (may be overridden per instance in ``__init__``):
        extra_layers: intermediate layers to pool for ``batch.layers``.
        needs_token_states: request ``batch.token_states``.
        requires_hard_negative: the term needs supervised triplets (``ValueError`` at
            build time on unsupervised data).
    """

    type_name: ClassVar[str] = ""
    extra_layers: tuple[int, ...] = ()
    needs_token_states: bool = False
    requires_hard_negative: bool = False

    def __init__(self, ctx: ObjectiveContext):
        super().__init__()
        self.ctx_hidden_size = ctx.hidden_size

    @abc.abstractmethod
    def forward(self, batch: ObjectiveBatch) -> LossOutput:
        """Return a scalar loss tensor, or a dict of named scalar sub-terms (summed by the trainer)."""
