"""3R (the 3R paper, Eqs. 3-5) on hand-computed tensors, the Table 3 variants, and the pool miner."""

from __future__ import annotations

import math

import pytest
import torch

from training.data.redundant_pool import mine_redundant_pool, top_words
from training.three_r import ThreeR, batch_sigma, reduce_redundancy, redundant_mask

H = torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, 1.0]])  # N=2, D=3
HBAR = torch.tensor([10.0, 20.0, 30.0])


def test_sigma_is_population_std_eq3():
    # per-dim means (2, 2, 0.5); deviations (±1, 0, ±0.5); population std divides by N=2
    assert torch.allclose(batch_sigma(H), torch.tensor([1.0, 0.0, 0.5]))


def test_redundant_set_and_reduction_eq5():
    sigma = batch_sigma(H)
    mask = redundant_mask(sigma, torch.tensor(0.75))
    assert mask.tolist() == [0.0, 1.0, 1.0]  # S = {d : sigma_d < c} = {1, 2}
    out = reduce_redundancy(H, HBAR, mask, "subtract")
    assert out.tolist() == [[1.0, -18.0, -30.0], [3.0, -18.0, -29.0]]
    # a dimension with sigma exactly equal to c is not redundant (strict <)
    assert redundant_mask(sigma, torch.tensor(0.5)).tolist() == [0.0, 1.0, 0.0]


def test_table3_variants_on_hand_tensors():
    mask = torch.tensor([0.0, 1.0, 1.0])
    assert reduce_redundancy(H, HBAR, mask, "zero").tolist() == [[1.0, 0.0, 0.0], [3.0, 0.0, 0.0]]
    assert reduce_redundancy(H, HBAR, mask, "all").tolist() == [[-9.0, -18.0, -30.0], [-7.0, -18.0, -29.0]]
    with pytest.raises(ValueError):
        reduce_redundancy(H, HBAR, mask, "bogus")


def test_gradient_reaches_c_through_sigmoid_surrogate():
    beta = 0.5
    c = torch.tensor(0.75, requires_grad=True)
    sigma = batch_sigma(H)
    w = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]])
    out = reduce_redundancy(H, HBAR, redundant_mask(sigma, c, beta, "sigmoid"), "subtract")
    (out * w).sum().backward()
    # dL/dm_d = sum_i w_id * (-hbar_d); dm_d/dc = s(1-s)/beta with s = sigmoid((c - sigma_d)/beta)
    expected = 0.0
    for d, sd in enumerate([1.0, 0.0, 0.5]):
        s = 1.0 / (1.0 + math.exp(-(0.75 - sd) / beta))
        expected += (w[0, d].item() + w[1, d].item()) * (-HBAR[d].item()) * s * (1 - s) / beta
    assert c.grad is not None
    assert c.grad.item() == pytest.approx(expected, rel=1e-5)
    # forward stays hard (exact subtraction), whatever the surrogate
    assert out[0, 1].item() == -18.0


def test_identity_estimator_gives_c_the_sum_of_mask_gradients():
    c = torch.tensor(0.75, requires_grad=True)
    w = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]])
    out = reduce_redundancy(H, HBAR, redundant_mask(batch_sigma(H), c, estimator="identity"), "subtract")
    (out * w).sum().backward()
    # dm_d/dc = 1 for every d: dL/dc = sum_d sum_i w_id * (-hbar_d)
    expected = sum((w[0, d] + w[1, d]).item() * -HBAR[d].item() for d in range(3))
    assert c.grad.item() == pytest.approx(expected, rel=1e-6)
    assert out.tolist() == [[1.0, -18.0, -30.0], [3.0, -18.0, -29.0]]  # forward unchanged: S = {1, 2}


def test_c_moves_from_outside_sigmas_range_only_with_identity_estimator():
    """c above every sigma (the paper's U(0,1) init on a small encoder): the float32 sigmoid saturates."""
    sigma = torch.tensor([0.06, 0.24, 0.45])
    grads = {}
    for est in ("sigmoid", "identity"):
        c = torch.tensor(0.88, requires_grad=True)
        out = reduce_redundancy(H, HBAR, redundant_mask(sigma, c, 0.02, est), "subtract")
        out.sum().backward()
        grads[est] = c.grad.item()
    assert grads["sigmoid"] == 0.0
    assert grads["identity"] == pytest.approx(-2 * HBAR.sum().item())
    with pytest.raises(ValueError):
        redundant_mask(sigma, torch.tensor(0.5), estimator="straight")


def test_dynamic_mask_gradient_uses_embedding_values():
    c = torch.tensor(0.75, requires_grad=True)
    out = reduce_redundancy(H, HBAR, redundant_mask(batch_sigma(H), c, 1.0, "sigmoid"), "zero")
    out.sum().backward()
    s = [1.0 / (1.0 + math.exp(-(0.75 - sd))) for sd in (1.0, 0.0, 0.5)]
    expected = sum(-(H[0, d] + H[1, d]).item() * s[d] * (1 - s[d]) for d in range(3))
    assert c.grad.item() == pytest.approx(expected, rel=1e-5)


def test_dynamic_mask_with_every_dimension_masked_is_refused(caplog):
    # c above every sigma: the dynamic mask zeroes every embedding, the InfoNCE is the constant log N and neither
    # the embeddings nor c get any gradient (seen on the raw encoder with c ~ U(0, 1) = 0.496, max sigma 0.36)
    from training.objectives.simcse import info_nce

    h = (0.1 * torch.randn(8, 16, generator=torch.Generator().manual_seed(0))).requires_grad_(True)
    tr = ThreeR([], [], variant="dynamic_mask", c_init=0.9, c_estimator="sigmoid")
    mask = redundant_mask(batch_sigma(h.detach()), tr.c)
    h_hat = reduce_redundancy(h, torch.zeros(16), mask, "zero")
    loss = info_nce(h_hat, h_hat)
    loss.backward()
    assert loss.item() == pytest.approx(math.log(8)) and h.grad.abs().max() == 0 and tr.c.grad == 0
    with pytest.raises(ValueError, match="all 16 dimensions have sigma < c"):
        tr.prepare(None, h.detach(), step=0)
    with caplog.at_level("WARNING", logger="training.three_r"):
        tr.prepare(None, h.detach(), step=5)  # reached later in a run: a warning, once
        tr.prepare(None, h.detach(), step=6)
    assert sum("all 16 dimensions" in r.message for r in caplog.records) == 1


def test_dynamic_mask_threshold_learns_only_through_the_sigmoid_estimator():
    # under the dynamic mask the identity estimator gives c exactly no gradient: the masked dimensions are 0 in every
    # view (so is the cosine's gradient there) and the unmasked ones cancel (a cosine ignores the scale of each h);
    # the sigmoid estimator weights the dimensions near the threshold, which do not cancel
    from training.objectives.simcse import info_nce

    g = torch.Generator().manual_seed(0)
    h = 0.1 * torch.randn(8, 16, generator=g)
    h_pos = h + 0.01 * torch.randn(8, 16, generator=g)
    sigma = batch_sigma(h)

    def c_grad(c0: float, estimator: str) -> float:
        c = torch.tensor(c0, requires_grad=True)
        m = redundant_mask(sigma, c, 0.02, estimator)
        zero = torch.zeros(16)
        info_nce(reduce_redundancy(h, zero, m, "zero"), reduce_redundancy(h_pos, zero, m, "zero")).backward()
        return abs(c.grad.item())

    median = float(sigma.median())
    assert c_grad(1e-5, "identity") < 1e-8 and c_grad(median, "identity") < 1e-8
    assert c_grad(median, "sigmoid") > 1e-4
    with pytest.raises(ValueError, match="dynamic_mask with c_estimator 'identity'"):
        ThreeR([], [], variant="dynamic_mask", c_estimator="identity")
    ThreeR([], [], variant="dynamic_mask", c_estimator="identity", learn_c=False)  # a fixed threshold is fine


def test_three_r_module_validates_and_samples_deterministically():
    pool = [f"sentence number {i}" for i in range(10)]
    tr = ThreeR(pool, ["the"], k=6, seed=3)
    a, b = tr.sample_pool(5), tr.sample_pool(5)
    assert a == b and len(set(a)) == 6
    assert tr.sample_pool(6) != a
    with pytest.raises(ValueError):
        ThreeR(pool, [], variant="nope")
    with pytest.raises(ValueError):
        ThreeR([], ["the"], variant="3r")
    assert not ThreeR(pool, ["the"], variant="overall_subtraction").c.requires_grad


def test_pool_miner_covers_top_words_and_respects_limits():
    corpus = [
        "the cat sat on the mat",
        "a dog and a cat",
        "the dog was on a mat",
        "cat and dog and mat",
        "the mat was a cat",
        "zebra quokka axolotl narwhal",
    ] * 3 + ["one two three four five six seven eight nine ten eleven twelve the cat"]
    top = top_words(corpus, 8)
    pool, top2, stats = mine_redundant_pool(
        corpus, n_top_words=8, pool_size=6, max_tokens=7, min_top_fraction=0.8, seed=0
    )
    assert top == top2 and len(pool) == len(set(pool)) and 0 < len(pool) <= 6
    assert all(len(s.split()) <= 7 for s in pool)
    assert "zebra quokka axolotl narwhal" not in pool
    words = [w for s in pool for w in s.split()]
    if stats["fully_covered"]:
        assert all(words.count(w) >= 2 for w in top)
    assert stats["covered_words"] == sum(words.count(w) >= 2 for w in top)
    with pytest.raises(ValueError):
        mine_redundant_pool(["zebra quokka"] * 3 + ["a b"], n_top_words=1, min_top_fraction=1.0, max_tokens=1)
