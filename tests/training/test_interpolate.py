"""WiSE-FT (``python -m training interpolate``) on two tiny randomly initialised BERTs built here: alpha 0 gives the
start's weights, 1 the fine-tuned ones, 0.5 their mean (module folders too); mismatched checkpoints are refused; the
chooser scores every alpha on SciFact dev and STS-B dev and applies its rule."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def _bert(path: Path, seed: int, hidden: int = 32, tokenizer: bool = True) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    from training.st_dir import default_model_dir

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=2 * hidden, max_position_embeddings=256)  # fmt: skip
    BertModel(cfg).save_pretrained(path)
    if tokenizer:
        for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            shutil.copy(default_model_dir() / f, path / f)
    (path / "2_Dense").mkdir()
    save_file({"linear.weight": torch.randn(4, hidden)}, str(path / "2_Dense" / "model.safetensors"))
    return path


def _weights(d: Path) -> dict:
    from safetensors.torch import load_file

    return {**load_file(str(d / "model.safetensors")), **load_file(str(d / "2_Dense" / "model.safetensors"))}


def test_interpolation_endpoints_and_mean(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from training.cli.interpolate import main

    start, ft = _bert(tmp_path / "start", 0, tokenizer=False), _bert(tmp_path / "ft", 1, tokenizer=False)
    # an integer buffer only the start holds (older transformers saved position_ids) is left out, as ft leaves it
    w0 = load_file(str(start / "model.safetensors"))
    save_file({**w0, "embeddings.position_ids": torch.arange(256)[None]}, str(start / "model.safetensors"))
    ws, wf = _weights(start), _weights(ft)
    assert any(not torch.equal(ws[k], wf[k]) for k in wf)
    for alpha in (0.0, 1.0, 0.5):
        out = tmp_path / f"out-{alpha}"
        assert main(["--start", str(start), "--finetuned", str(ft), "--alpha", str(alpha), "--out", str(out)]) == 0
        got = _weights(out)
        assert set(got) == set(wf) and (out / "config.json").is_file()
        for k, v in got.items():
            want = ws[k] if alpha == 0 else wf[k] if alpha == 1 else (ws[k] + wf[k]) / 2
            if v.is_floating_point():
                assert torch.allclose(v, want, atol=1e-7, rtol=0) and v.dtype == wf[k].dtype, k
            else:
                assert torch.equal(v, wf[k]), k
    assert json.loads((tmp_path / "out-0.5" / "wise_ft.json").read_text())["alpha"] == 0.5
    from transformers import BertModel

    BertModel.from_pretrained(tmp_path / "out-0.5")  # loads as the fine-tuned model does


def test_mismatched_checkpoints_are_refused(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from training.cli.interpolate import main

    start = _bert(tmp_path / "start", 0, tokenizer=False)
    wider = _bert(tmp_path / "wider", 1, hidden=48, tokenizer=False)
    args = ["--start", str(start), "--alpha", "0.5", "--out", str(tmp_path / "o")]
    assert main([*args, "--finetuned", str(wider)]) == 1
    assert "shape" in capsys.readouterr().err and not (tmp_path / "o").exists()
    fewer = _bert(tmp_path / "fewer", 1, tokenizer=False)
    w = load_file(str(fewer / "model.safetensors"))
    save_file({k: v for k, v in w.items() if "pooler" not in k}, str(fewer / "model.safetensors"))
    assert main([*args, "--finetuned", str(fewer)]) == 1
    assert "pooler" in capsys.readouterr().err
    shutil.rmtree(fewer / "2_Dense")
    assert main([*args, "--finetuned", str(fewer)]) == 1
    assert "weight files" in capsys.readouterr().err
    assert main([*args[:-2], "--finetuned", str(start)]) == 2  # --alpha without --out
    assert main([*args[:2], "--finetuned", str(start), "--alpha", "1.5", "--out", str(tmp_path / "o")]) == 2


def test_chooser_reports_both_dev_scores_for_each_alpha(tmp_path, capsys):
    from training.cli.interpolate import main

    start, ft = _bert(tmp_path / "start", 0), _bert(tmp_path / "ft", 1)
    out = tmp_path / "chosen"
    argv = ["--start", str(start), "--finetuned", str(ft), "--grid", "0.5,1", "--max-queries", "10",
            "--max-corpus", "40", "--sts-limit", "60", "--max-seq-length", "64", "--json", str(tmp_path / "r.json"),
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert [row["alpha"] for row in r["rows"]] == [0.0, 0.5, 1.0]  # the start always scored
    for row in r["rows"]:
        assert 0 <= row["scifact-dev-ndcg@10"] <= 100 and -100 <= row["stsb-dev"] <= 100
    floor = r["rows"][0]["stsb-dev"] - 0.5
    ok = [row for row in r["rows"] if row["stsb-dev"] >= floor]
    assert r["alpha"] == max(ok, key=lambda row: (row["scifact-dev-ndcg@10"], row["alpha"]))["alpha"]
    assert json.loads((out / "wise_ft.json").read_text())["alpha"] == r["alpha"]
    assert r["dev_queries"] == 1 and "STS-B dev" in r["rule"]
    # run again: the rows recorded for the same inputs are reused (a marked score comes back), not re-encoded
    r["rows"][1]["scifact-dev-ndcg@10"] = 99.5
    (tmp_path / "r.json").write_text(json.dumps(r))
    assert main(argv) == 0
    again = json.loads((tmp_path / "r.json").read_text())
    assert again["rows"][1]["scifact-dev-ndcg@10"] == 99.5
    # another fine-tuned checkpoint under the same path: nothing is reused
    (ft / "model.safetensors").write_bytes((start / "model.safetensors").read_bytes())
    assert main(argv) == 0
    fresh = json.loads((tmp_path / "r.json").read_text())
    assert fresh["rows"][1]["scifact-dev-ndcg@10"] != 99.5
    assert fresh["rows"][0]["scifact-dev-ndcg@10"] == fresh["rows"][2]["scifact-dev-ndcg@10"]  # ft's BERT = start's
