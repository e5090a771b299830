"""SentEval transfer tasks: frozen sentence embeddings as features of a logistic regression.

Protocol of SentEval (Conneau & Kiela, arXiv:1803.05449, §4) in its scikit-learn configuration, as SimCSE
and the redundancy-reduction papers report it (accuracy ×100):

* MR, CR, SUBJ, MPQA: 10-fold cross-validation (``StratifiedKFold``, shuffled, seed 1111); inside each
  training fold the inverse regularisation ``C`` ∈ {2^-2 … 2^3} is chosen by an inner 10-fold CV
  (SentEval's ``InnerKFoldClassifier``); the score is the mean outer-fold test accuracy.
* SST-2: ``C`` ∈ {2^-2 … 2^3} chosen on dev accuracy; test accuracy (``SplitClassifier``).
* TREC (6 coarse classes) and MRPC: ``C`` ∈ {2^-1 … 2^5} chosen by 10-fold CV on train; test accuracy
  (``KFoldClassifier``), plus F1 of the paraphrase class for MRPC.

MRPC features: SentEval's code uses ``[|u − v|, u ⊙ v]``; InferSent's paper text also lists ``u`` and ``v``.
We follow the code by default (``mrpc_features="senteval"``) so numbers compare with the published tables;
``"infersent"`` gives ``[u, v, |u − v|, u ⊙ v]``. SentEval predates scikit-learn's lbfgs default (it ran
liblinear); we use lbfgs with ``max_iter=1000`` so every fit converges. Regularisation is never chosen on test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from training.data.transfer import TRANSFER_TASKS, TransferTask, load_transfer_task
from training.evaluation import EncodeFn, unique_encode

INNER_CS = [2.0**t for t in range(-2, 4)]  # SentEval InnerKFoldClassifier / SplitClassifier
KFOLD_CS = [2.0**t for t in range(-1, 6)]  # SentEval KFoldClassifier
SENTEVAL_SEED = 1111


def _fit(x: np.ndarray, y: np.ndarray, c: float, seed: int) -> LogisticRegression:
    return LogisticRegression(C=c, max_iter=1000, random_state=seed).fit(x, y)


def _cv_accuracy(x: np.ndarray, y: np.ndarray, c: float, k: int, seed: int) -> float:
    folds = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(x, y)
    return float(np.mean([_fit(x[tr], y[tr], c, seed).score(x[te], y[te]) for tr, te in folds]))


def _best_c(x: np.ndarray, y: np.ndarray, cs: Sequence[float], k: int, seed: int) -> tuple[float, float]:
    """``(C, cv accuracy)`` maximising ``k``-fold CV accuracy on ``(x, y)`` (first best on ties, as SentEval)."""
    scores = [_cv_accuracy(x, y, c, k, seed) for c in cs]
    i = int(np.argmax(np.round(scores, 4)))
    return cs[i], scores[i]


def nested_cv_accuracy(x: np.ndarray, y: np.ndarray, k: int = 10, seed: int = SENTEVAL_SEED) -> dict[str, float]:
    """Mean outer-fold test accuracy ×100 with ``C`` chosen by inner ``k``-fold CV inside each training fold.

    ``x``: ``(N, D)`` features, ``y``: ``(N,)`` labels. Returns ``{"acc", "devacc"}`` (devacc: mean inner CV).
    """
    accs, devs = [], []
    for tr, te in StratifiedKFold(n_splits=k, shuffle=True, random_state=seed).split(x, y):
        c, dev = _best_c(x[tr], y[tr], INNER_CS, k, seed)
        accs.append(_fit(x[tr], y[tr], c, seed).score(x[te], y[te]))
        devs.append(dev)
    return {"acc": 100 * float(np.mean(accs)), "devacc": 100 * float(np.mean(devs))}


def dev_selected_accuracy(x: dict[str, np.ndarray], y: dict[str, np.ndarray], seed: int = SENTEVAL_SEED) -> dict:
    """Test accuracy ×100 with ``C`` chosen on dev accuracy; ``x``/``y`` keyed by ``train``/``dev``/``test``."""
    fits = [_fit(x["train"], y["train"], c, seed) for c in INNER_CS]
    devs = [m.score(x["dev"], y["dev"]) for m in fits]
    best = fits[int(np.argmax(np.round(devs, 4)))]
    return {"acc": 100 * float(best.score(x["test"], y["test"])), "devacc": 100 * float(max(devs))}


def cv_selected_test(
    x: dict[str, np.ndarray], y: dict[str, np.ndarray], k: int = 10, seed: int = SENTEVAL_SEED
) -> tuple[dict[str, float], np.ndarray]:
    """Test accuracy ×100 with ``C`` chosen by ``k``-fold CV on train; returns the scores and test predictions."""
    c, dev = _best_c(x["train"], y["train"], KFOLD_CS, k, seed)
    model = _fit(x["train"], y["train"], c, seed)
    pred = model.predict(x["test"])
    return {"acc": 100 * float(np.mean(pred == y["test"])), "devacc": 100 * dev}, pred


def _features(task: TransferTask, table: dict[str, np.ndarray], mrpc_features: str) -> np.ndarray:
    if task.sentences:
        return np.stack([table[s] for s in task.sentences]).astype(np.float64)
    u = np.stack([table[a] for a, _ in task.pairs]).astype(np.float64)
    v = np.stack([table[b] for _, b in task.pairs]).astype(np.float64)
    parts = [np.abs(u - v), u * v] if mrpc_features == "senteval" else [u, v, np.abs(u - v), u * v]
    return np.concatenate(parts, axis=1)


def _subsample(task: TransferTask, limit: int | None, seed: int) -> TransferTask:
    """At most ``limit`` examples per split (a fixed random, order-keeping choice): quick checks only."""
    if not limit:
        return task
    rng = np.random.default_rng(seed)
    keep = np.sort(
        np.concatenate(
            [rng.permutation(np.flatnonzero(task.split == s))[:limit] for s in dict.fromkeys(task.split.tolist())]
        )
    )
    return TransferTask(
        task.name,
        task.labels[keep],
        task.split[keep],
        sentences=[task.sentences[i] for i in keep] if task.sentences else [],
        pairs=[task.pairs[i] for i in keep] if task.pairs else [],
    )


def score_task(
    task: TransferTask,
    table: dict[str, np.ndarray],
    kfold: int = 10,
    seed: int = SENTEVAL_SEED,
    mrpc_features: Literal["senteval", "infersent"] = "senteval",
) -> dict[str, float]:
    """Score one task from precomputed embeddings ``table`` (text -> ``(D,)`` vector).

    Returns ``{"acc", "devacc"}`` (×100), plus ``"f1"`` for MRPC.
    """
    x, y = _features(task, table, mrpc_features), task.labels
    splits = set(task.split.tolist())
    if splits == {"train"}:
        return nested_cv_accuracy(x, y, kfold, seed)
    by = {s: (x[task.split == s], y[task.split == s]) for s in splits}
    xs, ys = {s: v[0] for s, v in by.items()}, {s: v[1] for s, v in by.items()}
    if "dev" in splits:
        return dev_selected_accuracy(xs, ys, seed)
    out, pred = cv_selected_test(xs, ys, kfold, seed)
    if task.name == "MRPC":
        out["f1"] = 100 * float(f1_score(ys["test"], pred))
    return out


def evaluate_transfer(
    encode: EncodeFn,
    tasks: Sequence[str] = tuple(TRANSFER_TASKS),
    kfold: int = 10,
    seed: int = SENTEVAL_SEED,
    limit: int | None = None,
    mrpc_features: Literal["senteval", "infersent"] = "senteval",
) -> dict[str, float]:
    """Accuracy ×100 per task (``"<task>"``), MRPC F1 (``"MRPC-f1"``) and ``"transfer_avg"`` over the seven
    tasks when all are run. Each distinct text is encoded once. ``limit``: at most N examples per split (quick
    checks, never headline numbers). Deterministic: the same encoder gives the same scores.

    Raises:
        KeyError: an unknown task name. FileNotFoundError: the transfer data is missing.
    """
    data = {t: _subsample(load_transfer_task(t), limit, seed) for t in tasks}
    scores: dict[str, float] = {}
    for name, task in data.items():
        table = unique_encode(encode, task.texts())
        s = score_task(task, table, kfold, seed, mrpc_features)
        scores[name] = s["acc"]
        if "f1" in s:
            scores[f"{name}-f1"] = s["f1"]
    if set(TRANSFER_TASKS) <= set(tasks):
        scores["transfer_avg"] = float(np.mean([scores[t] for t in TRANSFER_TASKS]))
    return scores
