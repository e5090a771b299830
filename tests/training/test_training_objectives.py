"""SimCSE InfoNCE (the 3R paper Eqs. 1-2) against a hand computation; the objective registry."""

from __future__ import annotations

import math

import pytest
import torch

from training.objectives import ObjectiveBatch, ObjectiveContext, build_objective, get_objective_class
from training.objectives.simcse import info_nce

A = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
P = torch.tensor([[2.0, 0.0], [1.0, 1.0], [0.0, 3.0]])
NEG = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [1.0, -1.0]])


def _cos(u, v):
    return sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))


def _hand(anchor, pos, neg, tau):
    a, p = anchor.tolist(), pos.tolist()
    n = neg.tolist() if neg is not None else []
    total = 0.0
    for i in range(len(a)):
        num = math.exp(_cos(a[i], p[i]) / tau)
        den = sum(math.exp(_cos(a[i], p[j]) / tau) for j in range(len(p)))
        den += sum(math.exp(_cos(a[i], n[j]) / tau) for j in range(len(n)))
        total += -math.log(num / den)
    return total / len(a)


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_unsupervised_infonce_eq1(tau):
    assert info_nce(A, P, None, tau).item() == pytest.approx(_hand(A, P, None, tau), rel=1e-5)


def test_supervised_infonce_eq2_hard_negatives():
    assert info_nce(A, P, NEG, 0.5).item() == pytest.approx(_hand(A, P, NEG, 0.5), rel=1e-5)
    # hard negatives enlarge the denominator: the loss grows
    assert info_nce(A, P, NEG, 0.5).item() > info_nce(A, P, None, 0.5).item()


def test_infonce_errors():
    with pytest.raises(ValueError):
        info_nce(A, P[:2])
    with pytest.raises(ValueError):
        info_nce(A, P, None, 0.0)


def test_registry_builds_simcse_and_rejects_unknown():
    ctx = ObjectiveContext(hidden_size=2, num_layers=1, vocab_size=10, pad_token_id=0)
    obj = build_objective("simcse", ctx, {"temperature": 0.5})
    batch = ObjectiveBatch(anchor=A, positive=P, hard_negative=NEG)
    assert obj(batch).item() == pytest.approx(_hand(A, P, NEG, 0.5), rel=1e-5)
    assert build_objective("simcse", ctx, {"temperature": 0.5, "use_hard_negative": False})(
        batch
    ).item() == pytest.approx(_hand(A, P, None, 0.5), rel=1e-5)
    with pytest.raises(KeyError):
        get_objective_class("no_such_objective")
