"""The reranker's evaluation protocol on a SciFact slice with the session's tiny reranker: the training run's model
choice is the test protocol on dev (its dev claims' first-stage top-k over the whole corpus, reranked, nDCG@10 by
BEIR's formula), the fusion with the first stage at alpha 0 / 1 / between, and ``python -m training rerank-eval``
choosing alpha on dev and reading test once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import reranker_config

pytestmark = pytest.mark.timeout(600)


def _min_max(xs):
    lo, hi = min(xs), max(xs)
    return [(x - lo) / (hi - lo) for x in xs]


def test_fusion_weight_alpha():
    from training.rerank_protocol import choose_alpha, fused, ndcg10, reranked

    run = {"q": [("a", 0.9), ("b", 0.5), ("c", 0.4), ("d", 0.1)]}
    raw = {"q": {"a": -2.0, "b": 3.0, "c": 1.0, "d": 0.5}}
    assert reranked(run, raw, 1.0)["q"] == ["b", "c", "d", "a"]
    assert reranked(run, raw, 0.0)["q"] == ["a", "b", "c", "d"]
    want = [0.4 * r + 0.6 * f for r, f in zip(_min_max([-2.0, 3.0, 1.0, 0.5]), _min_max([0.9, 0.5, 0.4, 0.1]))]
    assert fused([-2.0, 3.0, 1.0, 0.5], [0.9, 0.5, 0.4, 0.1], 0.4) == pytest.approx(want)
    assert reranked(run, raw, 0.4)["q"] == ["b", "a", "c", "d"]  # 0.6, 0.6 * 1, 0.4*0.6+0.6*0.375, 0.4*0.5
    assert fused([1.0, -1.0], [2.0, 1.0], 1.0) == [1.0, -1.0]  # alpha 1: the raw scores
    assert ndcg10({"q": ["b", "a"]}, {"q": {"a"}}) == pytest.approx(100 / 1.5849625007211563)
    assert choose_alpha({0.0: 50.0, 0.5: 60.0, 1.0: 60.0}) == 1.0


def test_first_stage_encoder_encodes_each_text_once(tmp_path):
    """The first stages' bi-encoder is one per directory and length in a process, and encodes a text once: a first
    call embeds exactly as the encoder does; later calls encode only unseen texts and answer in their order; a
    directory whose files changed is loaded again."""
    import shutil

    import numpy as np

    from training.data.scifact import load_scifact
    from training.rerank_protocol import MemoEncoder, encoder_fn
    from training.st_dir import default_model_dir

    data = load_scifact(4, 6, 42)
    docs = list(data.corpus.values())
    shared = encoder_fn(None, 64)
    assert encoder_fn(None, 64) is shared and encoder_fn(None, 32) is not shared
    copy = tmp_path / "encoder"
    shutil.copytree(default_model_dir(), copy)
    before = encoder_fn(copy, 64)
    assert encoder_fn(copy, 64) is before
    (copy / "config.json").touch()  # a rewritten directory is loaded again, never answered from the old memo
    assert encoder_fn(copy, 64) is not before
    calls = []

    def counted(texts):
        calls.append(list(texts))
        return shared.encode(texts)

    memo = MemoEncoder(counted)
    first = memo(docs)
    assert calls == [docs] and first.dtype == np.float32
    np.testing.assert_array_equal(first, shared.encode(docs))
    claim = next(iter(data.queries.values()))
    again = memo(docs[::-1] + [claim, docs[0]])
    assert calls[1:] == [[claim]]
    np.testing.assert_array_equal(again[: len(docs)], first[::-1])
    np.testing.assert_array_equal(again[-1], first[0])


def test_model_choice_is_the_test_protocol_on_dev(reranker_artifact):
    """The trained run's recorded dev nDCG@10 (the checkpoint choice) is its dev claims' DBSF top-k over the whole
    (sliced) corpus reranked by the chosen model, recomputed here from the protocol's parts; the first stage's own
    dev score and the alpha grid are recorded beside it."""
    from training.data.scifact import load_scifact
    from training.rerank_protocol import alpha_grid, first_stage, ndcg10, pair_scorer, reranked, score_run

    cfg = reranker_config()
    done = json.loads((Path(cfg.output_dir) / "model" / "done.json").read_text())
    dev = done["dev"]
    assert done["recipe"]["dev_first_stage"] == "dbsf" and done["recipe"]["dev_depth"] == cfg.dev_depth == 10
    data = load_scifact(cfg.max_queries, cfg.max_corpus, cfg.seed)
    qrels = {q: data.qrels[q] for q in done["dev_queries"]}
    run = first_stage(data, list(qrels), "dbsf", cfg.dev_depth, None, cfg.max_seq_length)
    assert all(len(hits) == cfg.dev_depth for hits in run.values())  # searched in the whole corpus, not mined
    scores = score_run(data, run, pair_scorer(Path(cfg.output_dir) / "model", cfg.max_seq_length))
    assert dev["scifact-dev_ndcg@10"] == pytest.approx(ndcg10(reranked(run, scores), qrels) / 100, abs=1e-6)
    first = ndcg10({q: [d for d, _ in h] for q, h in run.items()}, qrels) / 100
    assert dev["scifact-dev_first_stage_ndcg@10"] == pytest.approx(first, abs=1e-9)
    grid = alpha_grid(run, scores, qrels, [0.0, 0.5, 1.0])
    assert dev["scifact-dev_ndcg@10_alpha=0"] == pytest.approx(first, abs=1e-9)  # alpha 0: the first stage's order
    assert dev["scifact-dev_ndcg@10_alpha=0.5"] == pytest.approx(grid[0.5] / 100, abs=1e-6)
    assert dev["scifact-dev_ndcg@10_alpha=1"] == pytest.approx(dev["scifact-dev_ndcg@10"], abs=1e-9)
    assert 0.0 <= dev["scifact-dev_alpha"] <= 1.0


def test_rerank_eval_chooses_alpha_on_dev_and_reads_test_once(reranker_artifact, tmp_path, capsys, monkeypatch):
    from training import rerank_protocol
    from training.cli.rerank_eval import main

    reads = []
    real = rerank_protocol.first_stage

    def counted(data, qids, *a, **k):
        reads.append(len(qids))
        return real(data, qids, *a, **k)

    monkeypatch.setattr(rerank_protocol, "first_stage", counted)
    cfg = reranker_config()
    out = tmp_path / "r.json"
    argv = ["--model", str(reranker_artifact), "--first-stage", "bm25", "--max-queries", str(cfg.max_queries), "--max-corpus",
            str(cfg.max_corpus), "--dev-fraction", str(cfg.dev_fraction), "--seed", str(cfg.seed),
            "--max-test-queries", "6", "--depth", "10", "--max-length", "128", "--alphas", "0,0.5,1",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == r
    assert reads == [r["dev_queries"], 6]  # the dev first stage, then test once
    grid = {float(a): v for a, v in r["dev"]["alpha"].items()}
    assert set(grid) == {0.0, 0.5, 1.0} and r["alpha"] in grid and grid[r["alpha"]] == max(grid.values())
    assert grid[0.0] == pytest.approx(r["dev"]["first_stage"])
    chosen = f"alpha={r['alpha']:g}"
    assert {"first_stage", "alpha=1", chosen} == set(r["test"])
    for k in ("alpha=1", chosen):
        assert r["gap"][k] == pytest.approx(grid[float(k.split("=")[1])] - r["test"][k], abs=1e-3)
    assert main([*argv[:-2], "--alphas", "1.5"]) == 2
    assert main([*argv[:-2], "--first-stage", "bm25,nope"]) == 2
    # several first stages: each distinct pair scored once, the scores kept in --score-cache for the next run
    calls = []
    real_scorer = rerank_protocol.pair_scorer

    def counted_scorer(*a, **k):
        score = real_scorer(*a, **k)
        return lambda pairs: calls.append(len(pairs)) or score(pairs)

    monkeypatch.setattr(rerank_protocol, "pair_scorer", counted_scorer)
    cache, two = tmp_path / "scores.json", tmp_path / "two.json"
    argv2 = [*argv[:-2], "--first-stage", "bm25,dense", "--score-cache", str(cache), "--json", str(two)]
    assert main(argv2) == 0
    runs = json.loads(two.read_text())["runs"]
    assert [x["first_stage"] for x in runs] == ["bm25", "dense"] and runs[0] == r
    assert sum(calls) == len(json.loads(cache.read_text())["scores"]) < 2 * (r["dev_queries"] + 6) * 10
    calls.clear()
    assert main(argv2) == 0 and calls == [] and json.loads(two.read_text())["runs"] == runs  # read from the cache
