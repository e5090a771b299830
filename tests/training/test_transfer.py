"""SentEval transfer tasks: loaders on the real data, the protocol against scikit-learn and a hand-checked
case, and the real default encoder on a subsample."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score

from training.data.transfer import TRANSFER_TASKS, TransferTask, load_transfer_task
from training.transfer import INNER_CS, evaluate_transfer, nested_cv_accuracy, score_task


@pytest.mark.parametrize(
    "name, counts",
    [
        ("MR", {"train": 10662}),
        ("SUBJ", {"train": 10000}),
        ("SST2", {"train": 67349, "dev": 872, "test": 1821}),
        ("TREC", {"train": 5452, "test": 500}),
        ("MRPC", {"train": 4076, "test": 1725}),
    ],
)
def test_loaders_match_the_data_readme(name, counts):
    t = load_transfer_task(name)
    assert dict(Counter(t.split.tolist())) == counts
    assert all(t.texts())
    if name == "TREC":
        assert sorted(set(t.labels.tolist())) == [0, 1, 2, 3, 4, 5]
    if name == "MR":
        assert Counter(t.labels.tolist()) == {0: 5331, 1: 5331}


def test_nested_cv_equals_scikit_learn_nested_cv():
    """Our inner-CV selection equals GridSearchCV inside cross_val_score (an independent implementation)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((240, 6))
    y = (x[:, 0] + 0.8 * rng.standard_normal(240) > 0).astype(int)
    ours = nested_cv_accuracy(x, y, k=4, seed=7)
    cv = StratifiedKFold(n_splits=4, shuffle=True, random_state=7)
    inner = GridSearchCV(LogisticRegression(max_iter=1000, random_state=7), {"C": INNER_CS}, cv=cv)
    ref = 100 * cross_val_score(inner, x, y, cv=cv).mean()
    assert ours["acc"] == pytest.approx(ref, abs=1e-9)
    assert 60 < ours["acc"] < 95  # learnable but noisy: neither chance nor perfect


def test_pair_task_hand_checked():
    """MRPC-style: identical pairs are paraphrases. With one test label flipped the scores are known by hand:
    4 test pairs, predictions [1, 1, 0, 0], gold [1, 0, 0, 0] -> accuracy 75, F1 = 2*1/(2*1+1+0) = 66.67."""
    rng = np.random.default_rng(1)
    table = {f"s{i}": rng.standard_normal(8) for i in range(90)}
    pairs, labels = [], []
    for i in range(36):  # training pairs: identical (paraphrase) or two different sentences (not)
        same = i % 2 == 0
        pairs.append((f"s{2 * i}", f"s{2 * i}" if same else f"s{2 * i + 1}"))
        labels.append(int(same))
    pairs += [("s80", "s80"), ("s81", "s81"), ("s82", "s83"), ("s84", "s85")]  # predicted 1, 1, 0, 0
    labels += [1, 0, 0, 0]  # gold: the second identical pair is labelled "not a paraphrase"
    split = ["train"] * 36 + ["test"] * 4
    task = TransferTask("MRPC", np.array(labels), np.array(split), pairs=pairs)
    got = score_task(task, table, kfold=3)
    assert got["acc"] == pytest.approx(75.0)
    assert got["f1"] == pytest.approx(200 / 3)


def test_default_encoder_on_a_subsample_is_well_above_chance_and_deterministic(default_artifact):
    from training.evaluation import encode_fn_for

    enc = encode_fn_for(str(default_artifact))
    a = evaluate_transfer(enc, ["MR", "TREC"], kfold=3, limit=200)
    assert a["MR"] > 65  # chance is 50
    assert a["TREC"] > 50  # six classes; the majority class is ~23 %
    assert evaluate_transfer(enc, ["MR", "TREC"], kfold=3, limit=200) == a


def test_eval_cli_writes_sts_and_transfer_scores(default_artifact, tmp_path):
    from training.cli.eval import main

    out = tmp_path / "scores.json"
    args = ["--model", str(default_artifact), "--tasks", "STSBenchmark-dev,MPQA", "--limit", "150"]
    assert main([*args, "--kfold", "3", "--json", str(out)]) == 0
    scores = json.loads(out.read_text())
    assert set(scores) == {"STSBenchmark-dev", "MPQA"} and scores["MPQA"] > 60


def test_unknown_task_is_a_key_error():
    with pytest.raises(KeyError, match="unknown transfer task"):
        load_transfer_task("QQP")
    assert TRANSFER_TASKS == ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]
