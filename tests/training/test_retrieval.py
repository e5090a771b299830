"""Domain fine-tuning on a retrieval task (``data.mode: retrieval``) on a slice of BEIR SciFact: the split and the
triplets (dev queries never trained on, negatives never judged documents), nDCG@10 by BEIR's formula, a short run's
model choice and report; and the reranker's three losses build their columns and a finite loss."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.timeout(300)

SLICE = {"max_queries": 30, "max_corpus": 150}


@pytest.fixture(scope="module")
def task():
    from training.retrieval import RetrievalTask
    from training.st_dir import default_model_dir

    return RetrievalTask.build("beir/scifact", dev_fraction=0.2, split_seed=3, hard_negatives="bm25",
                               negatives_depth=3, model_dir=default_model_dir(), max_seq_length=64, **SLICE)  # fmt: skip


def test_ndcg_follows_beirs_formula():
    from training.retrieval import ndcg_at

    assert ndcg_at(["a", "b"], {"a": 1}) == 1.0
    assert ndcg_at(["x", "a"], {"a": 1}) == pytest.approx(1 / math.log2(3))
    assert ndcg_at(["x", "b", "a"], {"a": 1, "b": 1}) == pytest.approx(
        (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    )
    assert ndcg_at([f"d{i}" for i in range(10)] + ["a"], {"a": 1}) == 0.0  # rank 11: outside the cut


def test_triplets_train_on_train_queries_with_mined_negatives(task):
    data = task.data
    assert set(task.train_queries).isdisjoint(task.dev_queries) and len(task.dev_queries) == 6
    assert {data.queries[q] for q in task.dev_queries}.isdisjoint(t[0] for t in task.triplets)
    by_text = {data.corpus[d]: d for d in data.corpus}
    for q in task.train_queries:
        assert 0 < len(task.negatives[q]) <= 3 and not set(task.negatives[q]) & data.qrels[q]
    for query, pos, neg in task.triplets:
        q = next(k for k, v in data.queries.items() if v == query)
        assert by_text[pos] in data.qrels[q] and by_text[neg] not in data.qrels[q]
    assert len(task.triplets) == sum(len(data.qrels[q]) for q in task.train_queries)


def test_a_retrieval_run_chooses_by_dev_and_reports_test(tmp_path):
    """Negatives mined by BM25 and the dense model (interleaved), 3R on, 2 steps, dev every step, WiSE-FT of the
    chosen checkpoint (alphas 0 and 1) chosen on dev, test once for the chosen mix."""
    from safetensors.torch import load_file

    from training.config import TrainSettings
    from training.st_dir import default_model_dir
    from training.trainer import Trainer

    cfg = TrainSettings(
        data={"mode": "retrieval", "train_file": "beir/scifact", "hard_negatives": "bm25+dense", "negatives_depth": 2,
              "dev_fraction": 0.2, **SLICE},
        max_seq_length=32, batch_size=8, max_steps=2, eval_every=1, final_eval_tasks=[], export=False,
        progress=False, output_dir=str(tmp_path), three_r={"enabled": True, "c_init": 0.16}, wise_ft=[1.0],
        eval_limit=40,
    )  # fmt: skip
    res = Trainer(cfg).run()
    assert res["best_step"] in (1, 2) and (tmp_path / "best" / "model.safetensors").is_file()
    scores = {k.removesuffix("@40"): v for k, v in res["scores"].items()}
    assert set(scores) == {"scifact-dev-ndcg@10", "scifact-test-ndcg@10", "scifact-test-recall@100"}
    # two steps leave the default encoder nearly as it was: on 150 abstracts plus the test claims' positives a random
    # ranking scores ~2, the encoder far more
    assert scores["scifact-test-ndcg@10"] > 50 and scores["scifact-test-recall@100"] > 80
    assert res["c_final"] is not None
    wise = res["wise_ft"]
    assert [r["alpha"] for r in wise["rows"]] == [0.0, 1.0] and wise["alpha"] in (0.0, 1.0)
    assert scores["scifact-dev-ndcg@10"] == wise["dev"] == wise["rows"][int(wise["alpha"])]["scifact-dev-ndcg@10"]
    chosen = tmp_path / "best" if wise["alpha"] == 1.0 else default_model_dir()
    want, got = load_file(str(chosen / "model.safetensors")), load_file(str(tmp_path / "wise_ft" / "model.safetensors"))
    assert all((want[k] == got[k]).all() for k in got)  # the reported (and exported) model is the chosen mix


@pytest.mark.parametrize("loss", ["bce", "mnrl", "lambda"])
def test_reranker_losses_build_their_columns_and_a_finite_loss(task, loss):
    import torch
    from sentence_transformers import CrossEncoder

    from training.reranker import RerankerConfig, loss_and_rows
    from training.st_dir import default_model_dir

    model = CrossEncoder(str(default_model_dir()), num_labels=1, max_length=32, device="cpu")
    cfg = RerankerConfig(loss=loss, negatives_per_query=3)
    fn, rows = loss_and_rows(cfg, model, task.data, task.train_queries[:4], task.negatives)
    cols = {"bce": {"query", "passage", "label"}, "mnrl": {"query", "positive", "negative_1", "negative_2",
            "negative_3"}, "lambda": {"query", "docs", "labels"}}[loss]  # fmt: skip
    assert set(rows) == cols and len({len(v) for v in rows.values()}) == 1
    if loss == "bce":  # positives weighted by the negatives-per-positive ratio
        pos = sum(rows["label"])
        assert float(fn.pos_weight) == pytest.approx((len(rows["label"]) - pos) / pos)
    n = 2
    inputs = [rows[c][:n] for c in rows if c not in ("label", "labels")]
    labels = {"bce": lambda: torch.tensor(rows["label"][:n]), "mnrl": lambda: None,
              "lambda": lambda: [torch.tensor(x) for x in rows["labels"][:n]]}[loss]()  # fmt: skip
    value = fn(inputs, labels)
    assert torch.isfinite(value) and value.requires_grad
