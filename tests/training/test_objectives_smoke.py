"""CPU smoke trainings of methods, alone and + 3R, exported and served by one real service.

Each run uses the repository's config file (``configs/<method>[_3r].yaml``) with tiny
overrides: 2 steps of batch 8 on the first 64 corpus sentences. STS evaluation and the
export's parity/dev check read a *small* copy of STS-B (the first pairs of the real
files, via ``$SHARED_DATA_DIR``), so a run costs seconds; the scores are meaningless
and these artifacts live in a temporary directory only.

Checked per run: every configured loss term (and sub-term) is logged; 3R's c is logged
when on; the encoder's weights changed. Per "+ 3R" run (its graph is the method's with c and
3R's parts, so a train-only part of the method alone would show there too): the artifact
validates and contains no train-only parameters (its ONNX weight count equals the dense
default artifact's, or, for SparseCSE, the pruned encoder's); and the service loads it and
reproduces its canary.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import REPO_ROOT, run_server
from training.data.sts import default_corpus_file

pytestmark = pytest.mark.timeout(900)

CORPUS = Path(default_corpus_file())
TINY = {
    "max_steps": 2,
    "batch_size": 8,
    "data": {"max_train_samples": 64},
    "threads": 1,  # the suite's other worker has the second core: two torch threads beside it ran 1.4-1.8x slower
    "eval_every": 0,
    "final_eval": False,
    "save_every": 0,
    "progress": False,
    "three_r": {"pool_size": 8},
}
# (config file, extra params, loss keys that must be logged)
RUNS = {
    "informin": (
        "informin.yaml",
        {"losses": {"informin": {"params": {"beta": 0.1}}}},
        ["loss/simcse", "loss/informin/rec", "loss/informin/mlm"],
    ),
    "sscl": ("sscl.yaml", {"losses": {"sscl": {"params": {"progressive_k": 2}}}}, ["loss/sscl"]),
    "msse": ("msse.yaml", {}, ["loss/simcse", "loss/msse/dcm", "loss/msse/icm"]),
}
ADMIN = {"Authorization": "Bearer smoke-admin"}


def _onnx_weight_count(path: Path) -> int:
    import onnx

    m = onnx.load(str(path))
    return int(sum(np.prod(t.dims) for t in m.graph.initializer))


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """A $SHARED_DATA_DIR with the first rows of the real STS-B files (train: 400, dev/test: 48)."""
    from training.data.sts import data_dir

    real = data_dir()
    root = tmp_path_factory.mktemp("small_data")
    (root / "sts" / "STSBenchmark").mkdir(parents=True)
    for split, n in (("train", 400), ("dev", 48), ("test", 48)):
        lines = (real / "sts" / "STSBenchmark" / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines()
        (root / "sts" / "STSBenchmark" / f"sts-{split}.csv").write_text("\n".join(lines[:n]) + "\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHARED_DATA_DIR", str(root))
        yield root


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture(scope="module")
def trained(small_data, tmp_path_factory):
    """Run every smoke training once; returns ``{run_name: info}`` and the models dir."""
    import torch
    from safetensors.torch import load_file

    from training.config import load_settings
    from training.st_dir import default_model_dir
    from training.trainer import Trainer

    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("smoke")
    models = work / "models"
    base_w = load_file(str(default_model_dir() / "model.safetensors"))
    key = next(k for k in base_w if k.endswith("encoder.layer.5.output.dense.weight"))
    info = {}
    for method, (cfg_file, extra, keys) in RUNS.items():
        for three_r in (False, True):
            name = f"smoke-{method}{'-3r' if three_r else ''}"
            cfg_path = REPO_ROOT / "configs" / cfg_file.replace(".yaml", "_3r.yaml" if three_r else ".yaml")
            ov = _merge(TINY, extra)
            ov.update(
                {
                    "output_dir": str(work / name),
                    "models_dir": str(models),
                    "artifact_name": name,
                    "data": {**ov["data"], "train_file": str(CORPUS)},
                    "export": three_r,  # the "+ 3R" export holds every train-only part the method alone has, and c
                }
            )
            cfg = load_settings(cfg_path, ov)
            assert cfg.three_r.enabled is three_r
            res = Trainer(cfg).run()
            info[name] = {
                "dir": work / name,
                "artifact": Path(res["artifact"]) if three_r else None,
                "keys": keys + (["c"] if three_r else []),
                "sparse": False,
            }
    # SparseCSE: score -> prune 20% (+rewind) -> SimCSE fine-tune (alone / + 3R) -> export
    from training.sparse_pipeline import export_pruned, finetune_pruned, prune_model_dir, score_model

    imp = score_model(batch_size=8, max_batches=1)
    pruned = work / "sparse-pruned"
    st = prune_model_dir(imp, 0.2, pruned)
    for three_r in (False, True):
        name = f"smoke-sparsecse{'-3r' if three_r else ''}"
        ov = _merge(TINY, {"data": {"train_file": str(CORPUS)}})
        best = finetune_pruned(
            pruned,
            work / name,
            overrides=ov,
            config_file=str(REPO_ROOT / "configs" / ("sparsecse_3r.yaml" if three_r else "sparsecse.yaml")),
        )
        if three_r:
            export_pruned(best, models / name / "1", name=name, evaluate="dev")
        info[name] = {
            "dir": work / name,
            "artifact": models / name / "1" if three_r else None,
            "keys": ["loss/simcse"] + (["c"] if three_r else []),
            "sparse": True,
            "structure": st,
        }
    for v in info.values():
        w = load_file(str(v["dir"] / "best" / "model.safetensors"))
        k2 = next(k for k in w if k.endswith("encoder.layer.5.output.dense.weight"))
        v["changed"] = (w[k2].shape != base_w[key].shape) or not torch.equal(w[k2], base_w[key])
    return info, models


def test_every_term_logged_and_weights_changed(trained):
    info, _ = trained
    assert len(info) == 8
    for name, v in info.items():
        recs = [json.loads(l) for l in (v["dir"] / "metrics.jsonl").read_text().splitlines()]
        train = [r for r in recs if r["kind"] == "train"]
        assert len(train) == 2, name
        for k in v["keys"]:
            assert all(k in r and np.isfinite(r[k]) for r in train), (name, k)
        assert v["changed"], name


def test_artifacts_hold_no_train_only_parameters(trained, default_artifact):
    from artifact_contract import MODEL_FILE, validate_artifact
    from training.sparse.prune import count_parameters, load_pruned

    info, _ = trained
    dense = _onnx_weight_count(default_artifact / MODEL_FILE)
    exported = {name: v for name, v in info.items() if v["artifact"] is not None}
    assert len(exported) == 4
    for name, v in exported.items():
        validate_artifact(v["artifact"])
        n = _onnx_weight_count(v["artifact"] / MODEL_FILE)
        if not v["sparse"]:
            assert n == dense, name  # MLM head / ICM decoder / MLP head would add >= 147k weights
        else:
            # exactly the pruned units' weights are gone, nothing train-only was added
            removed = v["structure"].meta["params_before"] - count_parameters(load_pruned(v["dir"] / "best"))
            assert removed > 1_000_000 and n == dense - removed, name


def test_service_serves_every_artifact(trained, tmp_path_factory):
    """One service start: the first artifact is the default, the rest are loaded through /admin."""
    from artifact_contract import load_manifest

    info, models = trained
    names = [name for name, v in info.items() if v["artifact"] is not None]
    args = [
        "--default-model",
        names[0],
        "--admin-api-keys",
        "smoke-admin",
        "--intra-op-threads",
        "1",
        "--log-level",
        "warning",
    ]
    with run_server(models, workdir=tmp_path_factory.mktemp("smoke_svc"), args=args) as srv:
        with httpx.Client(base_url=srv.url, timeout=120.0) as c:
            for name in names:
                if name != names[0]:
                    r = c.post(f"/admin/models/{name}/load", headers=ADMIN)
                    assert r.status_code == 200, r.text
                man = load_manifest(info[name]["artifact"])
                r = c.post("/v1/embeddings", json={"input": man.canary.sentences, "model": name})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["model"] == name
                got = np.asarray([d["embedding"] for d in body["data"]], np.float32)
                np.testing.assert_allclose(got, np.asarray(man.canary.embeddings, np.float32), atol=1e-4)
        assert srv.alive(), srv.log()[-3000:]


def test_msse_with_pairs_file_positives(tmp_path):
    """MSSE positives from a user pairs file (data.mode: pairs): the positive view is the paired
    sentence, not a dropout copy; one real optimisation step runs and logs DCM and ICM."""
    import torch

    from training.config import load_settings
    from training.sparse.importance import positive_pairs
    from training.trainer import Trainer

    torch.set_num_threads(1)
    s1, s2 = positive_pairs("train", 4.0, limit=16)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(s1, s2)), encoding="utf-8")
    cfg = load_settings(
        REPO_ROOT / "configs" / "msse.yaml",
        {
            "data": {"mode": "pairs", "train_file": str(pairs)},
            "batch_size": 8,
            "max_steps": 1,
            "threads": 1,
            "output_dir": str(tmp_path / "run"),
            "progress": False,
            "export": False,
        },
    )
    tr = Trainer(cfg)
    views = tr.data.views(tr.data.batch(0))
    assert set(views) == {"anchor", "positive"}
    assert all(dict(zip(s1, s2))[a] == p for a, p in zip(views["anchor"], views["positive"]))
    logs = tr.train_step(0)
    assert logs["loss/msse/dcm"] > 0 and logs["loss/msse/icm"] > 0 and np.isfinite(logs["loss"])
