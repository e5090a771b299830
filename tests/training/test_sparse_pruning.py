"""SparseCSE (SparseCSE §2): masks, importance, physical pruning, save/load, smaller ONNX artifact.

Runs on the real default encoder (all-MiniLM-L6-v2) and real STS-B sentences.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from training.pooling import pool
from training.sparse.importance import (
    alignment_loss,
    compute_importance,
    positive_pairs,
    score_loss,
    uniformity_loss,
)
from training.sparse.masks import StructuredMasks, layer_shapes
from training.sparse.prune import (
    PruneStructure,
    apply_structure,
    count_parameters,
    expected_parameters,
    load_pruned,
    masks_for_structure,
    save_pruned,
    select_structure,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def base(default_model_dir):
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    model = AutoModel.from_pretrained(str(default_model_dir)).eval()
    return model, tok


@pytest.fixture(scope="module")
def sentences():
    s1, s2 = positive_pairs("train", 4.0, limit=64)
    return s1, s2


def _embed(tok):
    def f(model, sents):
        b = tok(list(sents), padding=True, truncation=True, max_length=32, return_tensors="pt")
        last = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
        return pool(last, b["attention_mask"], "mean")

    return f


# ------------------------------------------------------------------ score loss on hand-computed tensors
def test_alignment_uniformity_hand_computed():
    h = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    hp = torch.tensor([[2.0, 0.0], [1.0, 0.0]])  # normalised: (1,0),(1,0): sq dist 0 and 2 -> mean 1
    assert alignment_loss(h, hp).item() == pytest.approx(0.0, abs=1e-6)
    assert alignment_loss(h, hp, log=False).item() == pytest.approx(1.0, abs=1e-6)
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # pair sq distances 2, 4, 2
    want = math.log((2 * math.exp(-4) + math.exp(-8)) / 3)
    assert uniformity_loss(u).item() == pytest.approx(want, abs=1e-6)
    # L_score = λ A + (1-λ) (U(h)+U(h+))/2
    a = alignment_loss(u, u.flip(0)).item()
    assert score_loss(u, u.flip(0), 0.5).item() == pytest.approx(0.5 * a + 0.5 * want, abs=1e-6)
    with pytest.raises(ValueError):
        uniformity_loss(u[:1])


def test_select_structure_global_ranking_and_min_keep():
    heads = [torch.tensor([0.1, 0.9, 0.8]), torch.tensor([0.05, 0.02, 0.7])]
    neurons = [torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0.5, 0.6, 0.7, 0.8])]
    st = select_structure(heads, neurons, 0.5)  # 3 of 6 heads, 4 of 8 neurons
    assert st.heads == [[1, 2], [2]]  # lowest: 0.02, 0.05, 0.1 (global, across layers)
    # lowest four: 0.5, 0.6, 0.7 (layer 1), then 0.8 would empty layer 1 (min_neurons=1), so 1.0 (layer 0)
    assert st.neurons == [[1, 2, 3], [3]]
    assert st.head_sparsity == pytest.approx(0.5) and st.neuron_sparsity == pytest.approx(0.5)
    # min_keep: layer 1's heads are the two lowest, but one must stay, so the next lowest
    # (a 0.9 tie in layer 0, broken by index) goes instead
    st2 = select_structure(
        [torch.tensor([0.9, 0.9]), torch.tensor([0.1, 0.2])], [torch.ones(2), torch.ones(2)], 0.5, min_heads=1
    )
    assert st2.heads == [[1], [1]]
    st3 = select_structure(
        [torch.tensor([0.9, 0.8]), torch.tensor([0.1, 0.2])], [torch.ones(2), torch.ones(2)], 0.75, min_heads=1
    )
    assert [len(h) for h in st3.heads] == [1, 1]
    with pytest.raises(ValueError):
        select_structure(heads, neurons, 1.0)
    assert PruneStructure.from_json(st.to_json()).heads == st.heads


# ------------------------------------------------------------------ masks and importance on the real encoder
def test_zero_masks_change_output_and_ones_do_not(base, sentences):
    model, tok = base
    embed = _embed(tok)
    s = sentences[0][:6]
    masks = StructuredMasks.for_model(model)
    assert masks.num_heads() == 72 and masks.num_neurons() == 6 * 1536
    with torch.no_grad():
        ref = embed(model, s)
        with masks.applied(model):
            same = embed(model, s)
            masks.head_masks[2][5] = 0.0
            changed = embed(model, s)
        after = embed(model, s)  # detached: unmasked again
    assert torch.allclose(ref, same, atol=1e-6)
    assert (ref - changed).abs().max() > 1e-3
    assert torch.allclose(ref, after, atol=1e-6)


def test_importance_is_mean_abs_gradient(base, sentences):
    model, tok = base
    s1, s2 = sentences
    embed = _embed(tok)
    req = [p.requires_grad for p in model.parameters()]
    imp = compute_importance(model, embed, s1[:16], s2[:16], batch_size=8, max_batches=2)
    assert imp.n_batches == 2
    assert [len(h) for h in imp.heads] == [12] * 6 and [len(n) for n in imp.neurons] == [1536] * 6
    assert all((h >= 0).all() and h.sum() > 0 for h in imp.heads)
    assert [p.requires_grad for p in model.parameters()] == req  # restored
    assert all(p.grad is None for p in model.parameters())  # no gradient left on the encoder
    with pytest.raises(ValueError, match="batch_size must be >= 2"):  # one pair per batch has no negatives
        compute_importance(model, embed, s1[:16], s2[:16], batch_size=1)
    # by hand for one batch: |dL/dξ| of batch 1 and batch 2, averaged
    masks = StructuredMasks.for_model(model)
    grads = []
    for a, b in ((s1[:8], s2[:8]), (s1[8:16], s2[8:16])):
        masks.zero_grad(set_to_none=True)
        with masks.applied(model):
            score_loss(embed(model, a), embed(model, b), 0.5).backward()
        grads.append(masks.head_masks[3].grad.abs().clone())
    model.zero_grad(set_to_none=True)
    assert torch.allclose(imp.heads[3], (grads[0] + grads[1]) / 2, rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------ physical pruning == masking
@pytest.fixture(scope="module")
def pruned(base, sentences):
    model, tok = base
    s1, s2 = sentences
    imp = compute_importance(model, _embed(tok), s1[:16], s2[:16], batch_size=8, max_batches=2)
    st = select_structure(imp.heads, imp.neurons, 0.3)
    return st, apply_structure(copy.deepcopy(model), st)


def test_pruned_model_equals_masked_model(base, pruned, sentences):
    model, tok = base
    st, pm = pruned
    embed = _embed(tok)
    masks = masks_for_structure(st, 32)
    s = sentences[0][:16] + sentences[1][:16]
    with torch.no_grad():
        with masks.applied(model):
            masked = embed(model, s)
        full = embed(model, s)
        got = embed(pm, s)
    assert (masked - got).abs().max().item() < 1e-5
    assert (full - got).abs().max().item() > 1e-2  # pruning did change the function
    # physically smaller layers, per-layer head counts and FFN sizes differ
    shapes = layer_shapes(pm)
    assert [h for h, _ in shapes] == [len(h) for h in st.heads]
    assert [f for _, f in shapes] == [len(n) for n in st.neurons]
    assert sum(h for h, _ in shapes) == 72 - round(0.3 * 72)
    assert count_parameters(pm) == expected_parameters(st, 384, 32, count_parameters(model)) < count_parameters(model)


def test_save_load_roundtrip(pruned, base, sentences, tmp_path, default_model_dir):
    _, tok = base
    st, pm = pruned
    save_pruned(pm, st, tmp_path / "p", tokenizer_src=default_model_dir)
    back = load_pruned(tmp_path / "p")
    embed = _embed(tok)
    with torch.no_grad():
        assert torch.equal(embed(pm, sentences[0][:8]), embed(back, sentences[0][:8]))
    assert layer_shapes(back) == layer_shapes(pm)


def test_pruned_artifact_smaller_and_matches(pruned, base, default_artifact, tmp_path, default_model_dir):
    """Export the pruned model to ONNX (export_module checks parity vs torch) and compare with the dense artifact."""
    from artifact_contract import MODEL_FILE, validate_artifact
    from training.sparse_pipeline import export_pruned
    from training.st_dir import copy_st_config

    st, pm = pruned
    d = tmp_path / "p"
    save_pruned(pm, st, d, tokenizer_src=default_model_dir)
    copy_st_config(default_model_dir, d)
    man = export_pruned(d, tmp_path / "art", name="sparse-test", evaluate="none")
    validate_artifact(tmp_path / "art")
    assert man.parity.max_abs_diff <= 1e-4 and man.dimension == 384
    assert man.training["sparse_structure"]["heads"] == st.heads
    small = os.path.getsize(tmp_path / "art" / MODEL_FILE)
    dense = os.path.getsize(default_artifact / MODEL_FILE)
    # 30% of heads and neurons removed: ~3.2M of ~22.7M fp32 parameters, 4 bytes each, leave the graph
    removed_bytes = 4 * (count_parameters(base[0]) - count_parameters(pm))
    assert removed_bytes > 12_000_000
    assert 0.9 * removed_bytes < dense - small < 1.1 * removed_bytes
    # the generic exporter (python -m training export) recognises a pruned directory too
    from training.export import export_artifact

    man2 = export_artifact(d, tmp_path / "art2", name="sparse-test-generic", evaluate="none")
    assert man2.parity.max_abs_diff <= 1e-4
    assert abs(os.path.getsize(tmp_path / "art2" / MODEL_FILE) - small) < 0.02 * small


def test_importance_positives_are_sampled_across_genres_with_a_seed():
    """The first 16 batches of 32 positives (what scoring averages by default) hold every genre of STS-B train,
    news included, and the order is a function of the seed."""
    import csv

    from training.data.sts import data_dir

    genre = {}
    with open(data_dir() / "sts/STSBenchmark/sts-train.csv", encoding="utf-8") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(row) >= 7:
                genre[(row[5], row[6])] = row[0]
    s1, s2 = positive_pairs("train", 4.0, limit=512)
    seen = {genre[p] for p in zip(s1, s2)}
    assert seen == {"main-captions", "main-forum", "main-news"}
    assert positive_pairs("train", 4.0, limit=512) == (s1, s2)
    assert positive_pairs("train", 4.0, limit=512, seed=1) != (s1, s2)
