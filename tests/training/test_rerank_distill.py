"""Reranker distillation from the first stage (``train-reranker --loss margin_mse|listwise_kl --teacher dbsf``): the
teacher's scores are the first stage's fused DBSF scores, computed once and cached; the label weight mixes the two
losses exactly; both losses train a tiny cross-encoder (the loss falls); the CLI writes a run chosen by the dev
protocol, and a wall-clock budget ends training at an evaluated step. A tiny random BERT is the student; SciFact slices; the teacher's dense part is the default encoder."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
SLICE = {"max_queries": 16, "max_corpus": 60, "dev_fraction": 0.25, "seed": 3}


@pytest.fixture(scope="module")
def tiny_bert(default_model_dir: Path, tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32, no dropout) with the default encoder's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    root = tmp_path_factory.mktemp("tiny-bert") / "bert"
    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(cfg).save_pretrained(root)
    tok.save_pretrained(root)
    return root


def _student(path: Path):
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(1)
    return CrossEncoder(str(path), num_labels=1, max_length=48, device="cpu")


def _batch():
    """Two claims' candidate lists, as :func:`training.rerank_distill.teacher.candidates` makes them."""
    from training.data.scifact import SciFact
    from training.rerank_distill.teacher import Candidates

    corpus = {
        f"d{i}": t
        for i, t in enumerate(
            [
                "Statins lower LDL cholesterol in randomized trials.",
                "Vitamin D does not prevent fractures.",
                "Aspirin reduces the risk of heart attack.",
                "Smoking raises the risk of lung cancer.",
                "Exercise improves insulin sensitivity.",
                "Coffee intake is not linked to mortality.",
            ]
        )
    }
    data = SciFact(corpus, {"a": "Do statins lower cholesterol?", "b": "Does smoking cause cancer?"}, {})
    cands = {
        "a": Candidates(["d0", "d2", "d1", "d4"], [2.6, 2.1, 1.3, 0.9], [1.0, 0.0, 0.0, 0.0]),
        "b": Candidates(["d3", "d5", "d1"], [1.8, 2.4, 1.1], [1.0, 0.0, 0.0]),
    }
    return data, cands


def _listnet(loss, rows):
    import torch

    return loss([rows["query"], rows["docs"]], [torch.tensor(x) for x in rows["labels"]])


def _margin(loss, rows):
    import torch

    return loss([rows["query"], rows["positive"], rows["negative"]], torch.tensor(rows["label"]))


def test_listwise_target_mixes_teacher_and_labels_and_the_loss_exactly():
    from training.rerank_distill.listwise_kl import target_distribution

    t, y = [2.0, 1.5, 1.0], [0.0, 1.0, 0.0]
    e = [math.exp(x / 0.5) for x in t]
    p = target_distribution(t, y, 0.25, 0.5)
    assert p == pytest.approx([0.75 * x / sum(e) + 0.25 * yy for x, yy in zip(e, y)]) and sum(p) == pytest.approx(1)
    assert target_distribution(t, y, 1.0, 0.5) == pytest.approx(y)
    assert target_distribution(t, [0.0] * 3, 0.5, 0.5) == pytest.approx([x / sum(e) for x in e])  # no judged doc


def test_label_weight_mixes_the_losses_and_both_losses_train(tiny_bert):
    import torch

    from training.rerank_distill.listwise_kl import listwise_kl
    from training.rerank_distill.margin_mse import margin_mse

    data, cands = _batch()
    model = _student(tiny_bert)
    # listwise: CE is linear in its target, so the mixed loss is the weighted sum of the two, exactly
    parts = {w: listwise_kl(model, data, cands, w, 0.5) for w in (0.0, 0.3, 1.0)}
    with torch.no_grad():
        got = {w: float(_listnet(loss, rows)) for w, (loss, rows) in parts.items()}
    assert got[0.3] == pytest.approx(0.7 * got[0.0] + 0.3 * got[1.0], rel=1e-5)
    # margin-MSE: one row per (claim, judged, candidate); target (1 - w)(t_p - t_n)/T + w(y_p - y_n)
    loss, rows = margin_mse(model, data, cands, 0.3, 2.0)
    assert len(rows["label"]) == 3 + 2
    assert rows["positive"][0] == data.corpus["d0"] and rows["negative"][0] == data.corpus["d2"]
    assert rows["label"][0] == pytest.approx(0.7 * (2.6 - 2.1) / 2.0 + 0.3)
    assert rows["label"][3] == pytest.approx(0.7 * (1.8 - 2.4) / 2.0 + 0.3)  # the teacher ranks d5 above d3
    # both losses, as they ship, learn the mixed targets: a few steps on the batch lower them
    for make, call in ((listwise_kl, _listnet), (margin_mse, _margin)):
        model = _student(tiny_bert)
        loss, rows = make(model, data, cands, 0.5, 0.5)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        first = float(call(loss, rows))
        for _ in range(20):
            opt.zero_grad()
            call(loss, rows).backward()
            opt.step()
        last = float(call(loss, rows))
        floor = 0.0
        if make is listwise_kl:  # CE's floor is the target's entropy: compare KL = CE - H(p)
            floor = sum(-sum(math.exp(v) * v for v in lab if v > -60) for lab in rows["labels"]) / len(rows["labels"])
        assert last - floor < 0.5 * (first - floor), (make.__name__, first, last, floor)


def test_cli_distils_the_cached_dbsf_teacher_and_chooses_by_dev(tiny_bert, tmp_path, capsys, caplog, monkeypatch):
    from training.cli.train_reranker import main
    from training.data.scifact import load_scifact
    from training.rerank_protocol import first_stage

    out = tmp_path / "run"
    flags = [
        "--output-dir",
        str(out),
        "--model",
        str(tiny_bert),
        "--teacher",
        "dbsf",
        "--candidates-per-query",
        "4",
        "--label-weight",
        "0.5",
        "--max-steps",
        "2",
        "--eval-steps",
        "1",
        "--batch-size",
        "2",
        "--max-seq-length",
        "48",
        "--dev-depth",
        "8",
        "--negatives-per-query",
        "2",
        *[f"--{k.replace('_', '-')}={v}" for k, v in SLICE.items()],
    ]
    # --max-seconds: a wall-clock budget spent at the first step ends training there, evaluated and saved
    # --cpu-bf16 true: the steps run under bf16 autocast on this CPU (TrainingArguments refuses bf16 without use_cpu)
    argv = [*flags, "--loss", "listwise_kl", "--max-steps", "3", "--max-seconds", "0.001", "--cpu-bf16", "true"]
    assert main(argv) == 0
    printed = capsys.readouterr().out  # the trainer's logs, then the result as indented JSON
    result = json.loads(printed[printed.rindex("\n{\n") + 1 :])
    done = json.loads((out / "model" / "done.json").read_text())
    assert result["dev"] == done["dev"] and 0.0 <= done["dev"]["scifact-dev_ndcg@10"] <= 1.0
    assert done["steps"] == 1 and sorted(p.name for p in (out / "checkpoints").glob("checkpoint-*")) == ["checkpoint-1"]
    assert 0.0 < done["dev"]["scifact-dev_first_stage_ndcg@10"] <= 1.0 and "scifact-dev_alpha" in done["dev"]
    recipe = done["recipe"]
    assert (recipe["objective"], recipe["teacher"], recipe["candidates_per_query"]) == ("listwise_kl", "dbsf", 4)
    assert (recipe["label_weight"], recipe["teacher_temperature"], recipe["max_seq_length"]) == (0.5, 0.25, 48)
    assert recipe["cpu_bf16"] is True  # off, it is left out: the recipes of earlier runs stay as they were
    # the teacher: the train claims' DBSF first stage (dense: the default encoder; bm25s), as the dev protocol's
    cached = json.loads((out / "teacher.json").read_text())["run"]
    data = load_scifact(SLICE["max_queries"], SLICE["max_corpus"], SLICE["seed"])
    assert sorted(cached) == sorted(done["train_queries"]) and not set(cached) & set(done["dev_queries"])
    ref = first_stage(data, done["train_queries"], "dbsf", 8, None, 48)
    for q, hits in ref.items():
        assert [d for d, _ in cached[q]] == [d for d, _ in hits]
        assert [s for _, s in cached[q]] == pytest.approx([s for _, s in hits], abs=1e-5)
    # computed once: the margin-MSE recipe on the same claims reads the cache, the first stage is not run again
    import dataclasses

    from training.reranker import RerankerConfig, loss_and_rows

    def no_first_stage(*a, **k):
        raise AssertionError("the teacher was computed again")

    monkeypatch.setattr("training.rerank_protocol.first_stage", no_first_stage)
    cfg = RerankerConfig(**{f.name: recipe[f.name] for f in dataclasses.fields(RerankerConfig) if f.name in recipe})
    cfg = dataclasses.replace(cfg, output_dir=str(out), loss="margin_mse", teacher_temperature=0.5, cpu_bf16=False)
    assert "cpu_bf16" not in cfg.recipe()
    with caplog.at_level(logging.INFO, logger="training.rerank_distill"):
        loss, rows = loss_and_rows(cfg, _student(tiny_bert), data, done["train_queries"], {})
    assert f"teacher scores from {out / 'teacher.json'}" in caplog.text and type(loss).__name__ == "MarginMSELoss"
    q = done["train_queries"][0]
    top = {d: s for d, s in cached[q]}
    judged, best = sorted(data.qrels[q]), next(d for d, _ in cached[q] if d not in data.qrels[q])
    row = rows["query"].index(data.queries[q])
    assert rows["positive"][row] == data.corpus[judged[0]] and rows["negative"][row] == data.corpus[best]
    assert rows["label"][row] == pytest.approx(0.5 * (top.get(judged[0], 0.0) - top[best]) / 0.5 + 0.5)
    assert main([*flags, "--cpu-bf16", "maybe"]) == 2  # a usage error, before any work
    assert "--cpu-bf16: expected true or false, got 'maybe'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="label weight"):
        main([*flags, "--loss", "listwise_kl", "--label-weight", "1.5"])
