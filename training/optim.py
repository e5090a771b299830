"""The fine-tuning optimiser: AdamW with decoupled weight decay (none on biases and LayerNorm weights) and a
linear schedule with warmup (as in SimCSE's Hugging Face ``Trainer``, Gao et al., arXiv:2104.08821, §4)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

#: parameter-name fragments that take no weight decay
NO_DECAY = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")


def build_optimizer(
    named: Iterable[tuple[str, nn.Parameter]], *, lr: float, weight_decay: float, extra_groups: Iterable[dict] = ()
) -> torch.optim.AdamW:
    """AdamW over the trainable parameters in ``named``: ``weight_decay`` on all but :data:`NO_DECAY` ones, plus
    ``extra_groups`` (e.g. 3R's c with its own learning rate); empty groups are dropped."""
    named = [(n, p) for n, p in named if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not any(k in n for k in NO_DECAY)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if any(k in n for k in NO_DECAY)], "weight_decay": 0.0},
        *extra_groups,
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def linear_warmup(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning-rate factor ``(step + 1) / warmup`` for the first ``warmup`` steps, then linear decay to 0 at
    ``total`` steps."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
