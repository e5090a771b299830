"""InforMin-CL, SSCL and MSSE as trainer objectives on the real encoder: registry, gradients, train-only parts.

Each test builds the objective through the registry (as a config does), feeds it an
:class:`ObjectiveBatch` made from a real forward pass of all-MiniLM-L6-v2 on corpus
sentences, back-propagates, and checks which parameters received gradient.
"""

from __future__ import annotations

import pytest
import torch

from training.data.train_data import load_sentences
from training.encoder import SentenceEncoder
from training.objectives import ObjectiveBatch, ObjectiveContext, build_objective, get_objective_class

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def encoder():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return SentenceEncoder("", max_seq_length=24)


@pytest.fixture(scope="module")
def sents():
    from training.config import DataConfig

    return load_sentences(DataConfig().train_file, 6)


def _ctx(enc):
    tok = enc.tokenizer
    return ObjectiveContext(enc.hidden_size, enc.num_layers, len(tok), tok.pad_token_id, enc, False)


def _batch(enc, sents, layers=(), detach_views=False):
    enc.train()
    tok = enc.tokenize(sents)
    a = enc(**tok, layers=layers)
    p = enc(**tok, layers=layers)
    h, hp = (a.embedding.detach(), p.embedding.detach()) if detach_views else (a.embedding, p.embedding)
    return ObjectiveBatch(
        anchor=h,
        positive=hp,
        raw={"anchor": h, "positive": hp},
        layers={"anchor": a.layers, "positive": p.layers},
        input_ids={"anchor": tok["input_ids"], "positive": tok["input_ids"]},
        attention_mask={"anchor": tok["attention_mask"], "positive": tok["attention_mask"]},
        encoder=enc,
    )


def _has_grad(p) -> bool:
    return p.grad is not None and p.grad.abs().sum().item() > 0


def test_registry_resolves_the_relatives_loss_types():
    for t in ("informin", "sscl", "msse"):
        assert get_objective_class(t).type_name == t


def test_sscl_gradient_flows_only_below_the_negative_layer(encoder, sents):
    """With the final views detached, SSCL's gradient reaches the encoder only through the
    penultimate-layer negative: layers 0..4 get gradient, layer 5 (the last) gets none."""
    obj = build_objective("sscl", _ctx(encoder), {"layer": -2, "form": "paper"})
    assert obj.extra_layers == (-2,)
    encoder.zero_grad(set_to_none=True)
    b = _batch(encoder, sents, layers=obj.extra_layers, detach_views=True)
    loss = obj(b)
    assert loss.ndim == 0 and loss.item() > 0
    loss.backward()
    layers = encoder.model.encoder.layer
    assert all(_has_grad(layers[i].attention.self.query.weight) for i in range(5))
    assert not any(_has_grad(p) for p in layers[5].parameters())
    # progressive: last K=2 intermediate layers
    assert build_objective("sscl", _ctx(encoder), {"progressive_k": 2}).extra_layers == (-2, -3)
    with pytest.raises(ValueError):
        build_objective("sscl", _ctx(encoder), {"layer": -1})


@pytest.mark.parametrize("form, calls", [("paper", 1), ("authors", 2)])
def test_sscl_uses_3r_transform_on_negatives(encoder, sents, form, calls):
    obj = build_objective("sscl", _ctx(encoder), {"form": form})
    b = _batch(encoder, sents, layers=obj.extra_layers, detach_views=True)
    base = obj(b).item()
    seen = []
    b.transform = lambda x: (seen.append(x.shape), x * 0 + 1.0)[1]  # a transform that collapses negatives
    changed = obj(b).item()
    assert seen == [b.anchor.shape] * calls and changed != pytest.approx(base)


def test_sscl_default_is_the_authors_form(encoder, sents):
    """Default: both views' penultimate representations of every sentence are negatives of every anchor
    (2N extra columns), averaged with plain SimCSE: 1/2 (L_SSCL + L_SimCSE), computed here by hand."""
    import torch.nn.functional as F

    obj = build_objective("sscl", _ctx(encoder), {})
    assert obj.form == "authors"
    b = _batch(encoder, sents, layers=obj.extra_layers, detach_views=True)
    n = F.normalize
    a, p = n(b.anchor, dim=-1), n(b.positive, dim=-1)
    na, np_ = n(b.layers["anchor"][-2], dim=-1), n(b.layers["positive"][-2], dim=-1)
    target = torch.arange(len(sents))
    l_sscl = F.cross_entropy(torch.cat([a @ p.T, a @ na.T, a @ np_.T], 1) / 0.05, target)
    l_simcse = F.cross_entropy(a @ p.T / 0.05, target)
    assert obj(b).item() == pytest.approx(0.5 * (l_sscl + l_simcse).item(), rel=1e-5)
    paper = build_objective("sscl", _ctx(encoder), {"form": "paper"})(b).item()
    assert paper != pytest.approx(obj(b).item())
    with pytest.raises(ValueError, match="form"):
        build_objective("sscl", _ctx(encoder), {"form": "mine"})


def test_informin_rec_and_mlm_gradients(encoder, sents):
    obj = build_objective("informin", _ctx(encoder), {"lam": 0.4, "beta": 0.1})
    encoder.zero_grad(set_to_none=True)
    out = obj(_batch(encoder, sents))
    assert set(out) == {"rec", "mlm"}
    assert 0 < out["rec"].item() < 0.4 * 4
    assert out["mlm"].item() > 0
    sum(out.values()).backward()
    assert _has_grad(obj.mlm_head.dense.weight) and _has_grad(obj.mlm_head.bias)
    assert _has_grad(encoder.word_embeddings.weight)  # tied output layer + inputs
    assert _has_grad(encoder.model.encoder.layer[5].output.dense.weight)
    # the head is train-only: not an encoder parameter, and the tied table is not duplicated in the objective
    enc_ids = {id(p) for p in encoder.parameters()}
    assert not any(id(p) in enc_ids for p in obj.parameters())
    assert not any("word_embeddings" in k for k in obj.state_dict())
    # beta 0: no head at all
    assert build_objective("informin", _ctx(encoder), {}).mlm_head is None


def test_msse_dcm_icm_gradients(encoder, sents):
    obj = build_objective("msse", _ctx(encoder), {"mu": 0.8, "gamma": 0.2})
    encoder.zero_grad(set_to_none=True)
    out = obj(_batch(encoder, sents))
    assert set(out) == {"dcm", "icm"} and out["dcm"].item() > 0 and out["icm"].item() > 0
    out["icm"].backward(retain_graph=True)
    assert _has_grad(obj.decoder.proj.weight) and _has_grad(obj.decoder.pos)
    assert _has_grad(encoder.word_embeddings.weight)
    assert _has_grad(encoder.model.encoder.layer[5].output.dense.weight)  # through h
    encoder.zero_grad(set_to_none=True)
    obj.zero_grad(set_to_none=True)
    out["dcm"].backward()
    assert _has_grad(encoder.model.encoder.layer[0].attention.self.query.weight)
    assert not _has_grad(obj.decoder.proj.weight)  # DCM does not touch the decoder
    enc_ids = {id(p) for p in encoder.parameters()}
    assert not any(id(p) in enc_ids for p in obj.parameters())
    # the decoder reconstructs real tokens only: special ids are excluded
    assert encoder.tokenizer.cls_token_id in obj._special and encoder.tokenizer.sep_token_id in obj._special
