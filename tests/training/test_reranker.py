"""Reranker training and export: the SciFact pairs (split by query, negatives never positives), the manifest and its
parity contract, ONNX scores equal to ``CrossEncoder.predict``, and a finished run neither trained nor exported
twice (``python -m training train-reranker``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from artifact_contract import RERANK_OUTPUT_NAME, Manifest, load_manifest, validate_artifact, write_manifest
from tests.conftest import RERANKER_NAME, reranker_config

pytestmark = pytest.mark.timeout(600)


def test_split_is_by_query_and_negatives_are_never_positives():
    from training.data.scifact import load_scifact, mine_negatives, pair_rows, split_queries

    data = load_scifact(max_queries=30, max_corpus=200, seed=1)
    assert len(data.qrels) == 30 and all(data.qrels.values())
    train, dev = split_queries(list(data.qrels), 0.2, seed=1)
    assert set(train).isdisjoint(dev) and len(dev) == 6 and set(train) | set(dev) == set(data.qrels)
    assert split_queries(list(data.qrels), 0.2, seed=1) == (train, dev)  # seeded
    neg = mine_negatives(data, train + dev, depth=4)
    for q, docs in neg.items():
        assert len(docs) == 4 and not set(docs) & data.qrels[q]
    rows = pair_rows(data, dev, neg)
    assert len(rows["query"]) == sum(len(data.qrels[q]) + 4 for q in dev)
    assert set(rows["label"]) == {0.0, 1.0}
    assert {data.queries[q] for q in dev}.isdisjoint(pair_rows(data, train, neg)["query"])


def test_manifest_is_a_reranker_with_recorded_parity(reranker_artifact):
    m = validate_artifact(reranker_artifact)
    assert m.task == "reranker" and m.is_reranker
    assert (m.dimension, m.normalize, m.pooling, m.max_seq_length) == (1, False, "cls", 128)
    assert m.parity.min_cosine is None and m.parity.n_sentences >= 16
    assert 0 <= m.parity.max_abs_diff <= 1e-4
    assert "dev pairs" in m.parity.source and "CrossEncoder.predict" in m.parity.source
    assert m.training["recipe"] == reranker_config().recipe()
    assert 0 <= m.scores["scifact-dev-ndcg@10"] <= 100
    assert len(m.canary.queries) == len(m.canary.sentences) == len(m.canary.embeddings) == 4
    raw = json.loads((reranker_artifact / "manifest.json").read_text())
    assert raw["task"] == "reranker"


def test_encoder_manifests_keep_their_shape(default_artifact, tmp_path):
    m = load_manifest(default_artifact)
    assert m.task is None and not m.is_reranker
    write_manifest(tmp_path, m)
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert "task" not in raw and "queries" not in raw["canary"]


def test_contract_refuses_inconsistent_reranker_manifests(reranker_artifact, default_artifact):
    m = load_manifest(reranker_artifact).model_dump()
    with pytest.raises(ValidationError, match="dimension 1"):
        Manifest.model_validate({**m, "dimension": 2})
    with pytest.raises(ValidationError, match="canary.queries"):
        Manifest.model_validate({**m, "canary": {**m["canary"], "queries": None}})
    enc = load_manifest(default_artifact).model_dump()
    with pytest.raises(ValidationError, match="min_cosine"):
        Manifest.model_validate({**enc, "parity": {**enc["parity"], "min_cosine": None}})


def test_onnx_scores_equal_crossencoder_predict(reranker_artifact):
    import onnx
    import torch
    from sentence_transformers import CrossEncoder

    from training.export.reranker import onnx_pair_scores

    g = onnx.load(str(reranker_artifact / "model.onnx"))
    assert [i.name for i in g.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in g.graph.output] == [RERANK_OUTPUT_NAME]
    ce = CrossEncoder(str(reranker_config().output_dir + "/model"), device="cpu")
    long = "Randomized trials of statins " * 60  # over max_seq_length: truncated longest-first
    pairs = [("Do statins lower cholesterol?", long), ("a", "b"), ("Do statins lower cholesterol?", "Statins do.")]
    ref = ce.predict(pairs, activation_fn=torch.nn.Identity())
    got = onnx_pair_scores(reranker_artifact, pairs, batch_size=2)
    assert np.abs(ref - got).max() <= 1e-4


def test_finished_run_is_neither_trained_nor_exported_again(reranker_artifact, tmp_path, capsys):
    from training.cli.train_reranker import main

    cfg = reranker_config()
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(cfg).items()
             if v is not None and k not in ("resume", "models_dir")]  # fmt: skip
    assert main([*flags, "--publish", str(tmp_path), "--quantize", "int8", "--dtype", "fp16"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["skipped_training"] and not first["skipped_export"]
    assert first["artifact"] == str(tmp_path / RERANKER_NAME / "1")
    assert first["artifact_int8"] == str(tmp_path / f"{RERANKER_NAME}-int8" / "1")
    assert first["artifact_fp16"] == str(tmp_path / f"{RERANKER_NAME}-fp16" / "1")
    assert validate_artifact(first["artifact_fp16"]).dtype == "fp16"
    assert validate_artifact(first["artifact"]).is_reranker
    assert main([*flags, "--publish", str(tmp_path), "--quantize", "int8", "--dtype", "fp16"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["skipped_training"] and second["skipped_export"] and second["artifact"] == first["artifact"]
    assert (second["artifact_int8"], second["artifact_fp16"]) == (first["artifact_int8"], first["artifact_fp16"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        RERANKER_NAME,
        f"{RERANKER_NAME}-fp16",
        f"{RERANKER_NAME}-int8",
    ]
    assert [p.name for p in (tmp_path / f"{RERANKER_NAME}-int8").iterdir()] == ["1"]
    assert [p.name for p in (tmp_path / f"{RERANKER_NAME}-fp16").iterdir()] == ["1"]


def test_int8_reranker_loads_and_scores_close_to_fp32(reranker_artifact, tmp_path):
    from service.inference.onnx_reranker import OnnxReranker, open_model
    from training.export.reranker import CANARY_PAIRS
    from training.export.reranker_twins import quantize_reranker

    m = quantize_reranker(reranker_artifact, tmp_path / "rr-int8", name="rr-int8")
    assert (m.quantization, m.task, m.dimension) == ("int8", "reranker", 1)
    assert validate_artifact(tmp_path / "rr-int8").parity.source.endswith("int8 vs fp32 ONNX (informational)")
    assert (tmp_path / "rr-int8" / "model.onnx").stat().st_size < (reranker_artifact / "model.onnx").stat().st_size / 2
    int8 = open_model(tmp_path / "rr-int8", providers=["cpu"], intra_op_threads=1)
    fp32 = open_model(reranker_artifact, providers=["cpu"], intra_op_threads=1)
    assert isinstance(int8, OnnxReranker) and int8.check_canary() <= 1e-3
    assert np.abs(int8.scores_sync(CANARY_PAIRS) - fp32.scores_sync(CANARY_PAIRS)).max() < 0.1


def test_an_interrupted_run_resumes_from_its_checkpoint(reranker_artifact, tmp_path, caplog):
    import dataclasses
    import logging
    import os
    import shutil

    from training.reranker import train_reranker

    # the session run as if interrupted after its step-3 checkpoint (hard links, else copies)
    ckpt = tmp_path / "run" / "checkpoints"
    src = Path(reranker_config().output_dir) / "checkpoints"

    def link(a, b):  # a copy where the cache is on another file system
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, ckpt, copy_function=link, ignore=shutil.ignore_patterns("checkpoint-6", "eval"))
    cfg = dataclasses.replace(reranker_config(), output_dir=str(tmp_path / "run"))
    with caplog.at_level(logging.INFO, logger="training.reranker"):
        assert not train_reranker(cfg)["skipped_training"]
    assert f"resuming from {ckpt / 'checkpoint-3'}" in caplog.text
    assert json.loads((ckpt / "checkpoint-6" / "trainer_state.json").read_text())["global_step"] == 6
    assert train_reranker(cfg)["skipped_training"]  # finished: not trained again
