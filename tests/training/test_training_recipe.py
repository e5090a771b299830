"""SimCSE's recipe switches on a raw Hugging Face encoder: pooling choice (logged), [CLS] + MLP head at training
and [CLS] without it at test, and hub ids passed through to transformers."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from training.encoder import SentenceEncoder
from training.st_dir import default_model_dir


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    """A raw (MLM-style, no sentence-transformers files) BERT directory with the default encoder's vocabulary."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    d = tmp_path_factory.mktemp("raw")
    tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    BertModel(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_raw_directory_pooling_is_logged_with_its_reason(raw_dir, caplog):
    with caplog.at_level(logging.INFO, logger="training.encoder"):
        enc = SentenceEncoder(str(raw_dir))
    assert enc.pooling == "mean" and enc.head is None
    assert "no sentence-transformers pooling config" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="training.encoder"):
        enc = SentenceEncoder(str(raw_dir), pooling="cls")
    assert "cls pooling (set by the config)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="training.encoder"):
        SentenceEncoder("")
    assert "mean pooling (from its sentence-transformers pooling config)" in caplog.text


def test_cls_recipe_uses_the_head_in_training_and_not_at_test(raw_dir):
    """SimCSE unsupervised (cls_before_pooler): [CLS] + MLP head for the loss, plain [CLS] for evaluation."""
    enc = SentenceEncoder(str(raw_dir), pooling="cls")
    assert enc.head is not None  # mlp_head None: on for cls
    tok = enc.tokenize(["A man is playing a guitar.", "A woman slices an onion."])
    enc.eval()
    with torch.no_grad():
        out = enc.model(**tok).last_hidden_state[:, 0]
        trained = enc(**tok).embedding  # what the objectives see
        tested = enc.encode(["A man is playing a guitar.", "A woman slices an onion."])
    assert torch.allclose(trained, torch.tanh(enc.head.dense(out)), atol=1e-6)
    assert torch.allclose(torch.from_numpy(tested), out, atol=1e-5)
    assert SentenceEncoder(str(raw_dir), pooling="cls", mlp_head=False).head is None


def test_hub_id_goes_to_transformers(monkeypatch):
    """A name that is not a local directory is resolved by transformers as a hub id (offline here: its error)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError):
        SentenceEncoder("bert-base-uncased-not-cached-here")


@pytest.mark.parametrize("name", ["paper_simcse_3r", "raw_small_simcse", "raw_small_simcse_3r"])
def test_paper_configs_state_simcse_recipe(name):
    from training.config import load_settings
    from training.data.sts import REPO_ROOT

    cfg = load_settings(REPO_ROOT / "configs" / f"{name}.yaml")
    assert (cfg.pooling, cfg.mlp_head, cfg.max_seq_length, cfg.batch_size) == ("cls", True, 32, 64)
    assert (cfg.lr, cfg.num_epochs, cfg.eval_every, cfg.max_grad_norm) == (3e-5, 1.0, 125, 1.0)
    assert cfg.losses["simcse"].params["temperature"] == 0.05
    if name.endswith("3r"):
        assert cfg.three_r.enabled and cfg.three_r.c_init == "uniform"
    assert "~" not in cfg.model_name_or_path


def test_three_r_uniform_c_init_is_seeded():
    from training.three_r import ThreeR

    a = ThreeR(["a pool sentence"], [], c_init="uniform", seed=3).c.item()
    assert 0 < a < 1 and a == ThreeR(["a pool sentence"], [], c_init="uniform", seed=3).c.item()
    assert a != ThreeR(["a pool sentence"], [], c_init="uniform", seed=4).c.item()
    assert ThreeR(["x"], [], c_init=0.2).c.item() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="c_init"):
        ThreeR(["x"], [], c_init="normal")


def test_supervised_head_is_kept_at_test_time_and_exported(raw_dir, tmp_path):
    """Supervised SimCSE keeps its MLP at test time: saved as a sentence-transformers Dense, applied by
    evaluation, and traced into the ONNX graph; the manifest says so."""
    from artifact_contract import load_manifest
    from training.evaluation import encode_fn_for
    from training.export import export_artifact

    torch.manual_seed(1)
    enc = SentenceEncoder(str(raw_dir), pooling="cls")
    enc.inference_head = True  # what the trainer sets for data.mode sup
    torch.nn.init.normal_(enc.head.dense.weight, std=0.2)
    saved = enc.save_sentence_transformer(tmp_path / "best", with_head=True)
    sents = ["A man is playing a guitar.", "Two dogs run through a field."]
    with torch.no_grad():
        cls = enc.model(**enc.tokenize(sents, 128)).last_hidden_state[:, 0]
        want = torch.tanh(enc.head.dense(cls)).numpy()
    got = encode_fn_for(str(saved))(sents)
    assert abs(got - want).max() < 1e-5
    assert abs(got - cls.numpy()).max() > 1e-2  # the head really changes the embedding
    man = export_artifact(saved, tmp_path / "art", name="sup-head", evaluate="none")
    assert man.pooling == "cls" and "inference_head" in man.training
    onnx = encode_fn_for(str(tmp_path / "art"))(sents)
    cos = (onnx * want).sum(1) / (((onnx**2).sum(1) * (want**2).sum(1)) ** 0.5)  # the artifact normalises
    assert cos.min() > 0.9999
    assert load_manifest(tmp_path / "art").training["inference_head"].startswith("MLP")
    # without the Dense module the head is training-only: plain [CLS] at test
    plain = enc.save_sentence_transformer(tmp_path / "plain", with_head=False)
    assert abs(encode_fn_for(str(plain))(sents) - cls.numpy()).max() < 1e-5


def test_dropout_rate_changes_the_augmentation_noise(raw_dir):
    """SimCSE's only augmentation is dropout: the rate set by ``dropout`` must reach every dropout layer (two passes
    differ more at 0.3 than at 0.1, not at all at 0) and be recorded in the saved config."""
    enc = SentenceEncoder(str(raw_dir), pooling="cls", mlp_head=False)
    enc.train()
    texts = ["a man is playing a guitar .", "two dogs run across a field ."]

    def gap(p: float) -> float:
        enc.set_dropout(p)
        torch.manual_seed(0)
        with torch.no_grad():
            t = enc.tokenize(texts)
            a, b = enc(**t).embedding, enc(**t).embedding
        return float((1 - torch.nn.functional.cosine_similarity(a, b)).mean())

    assert gap(0.0) < 1e-6 < gap(0.1) < gap(0.3)
    assert enc.model.config.hidden_dropout_prob == 0.3 and enc.model.config.attention_probs_dropout_prob == 0.3
    with pytest.raises(ValueError):
        enc.set_dropout(1.0)
