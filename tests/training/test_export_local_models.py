"""Bring your own model: a sentence-transformers bi-encoder saved by the installed sentence-transformers (its current
Pooling format, Normalize, prompts, max length) through ``python -m training export``, and cross-encoders (a
``CrossEncoder.save`` directory with an identity activation, a plain Hugging Face sequence-classification directory)
through ``python -m training export-reranker``, all built here as tiny randomly initialised BERTs over the default
encoder's vocabulary; then the real service on those artifacts, its answers held to ``SentenceTransformer.encode`` and
``CrossEncoder.predict`` within the export tolerances (max |diff| 1e-4, cosine 0.9999)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from artifact_contract import validate_artifact
from tests.server_utils import run_server
from training.st_dir import read_st_config

pytestmark = pytest.mark.timeout(300)

MAX_LEN = 48
PROMPTS = {"query": "query: ", "document": ""}
SENTENCES = [
    "A man is playing a guitar.",
    "Cats sleep most of the day.",
    "Stocks fell sharply on Tuesday after the central bank raised interest rates, and bond yields rose across the "
    "curve as traders priced in further increases before the end of the year, longer than the tiny model's limit.",
    "Ok.",
]


def _bert(tokenizer, **kw):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **kw,
    )


@pytest.fixture(scope="module")
def local_models(default_model_dir: Path, tmp_path_factory) -> dict[str, Path]:
    """Three local model directories made as users make them: ``SentenceTransformer.save`` (Transformer + mean
    Pooling in the current format + Normalize, prompts, max length 48), ``CrossEncoder.save`` with an identity
    activation, and a raw ``BertForSequenceClassification.save_pretrained`` directory (one label)."""
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer, models
    from transformers import AutoTokenizer, BertForSequenceClassification, BertModel

    root = tmp_path_factory.mktemp("local-models")
    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    torch.manual_seed(0)
    BertModel(_bert(tok)).save_pretrained(root / "bert")
    tok.save_pretrained(root / "bert")
    t = models.Transformer(str(root / "bert"), max_seq_length=MAX_LEN)
    pool = models.Pooling(t.get_word_embedding_dimension(), pooling_mode="mean")
    st = SentenceTransformer(modules=[t, pool, models.Normalize()], prompts=PROMPTS, default_prompt_name="query")
    st.save(str(root / "bi-encoder"))
    # a wide initialisation, so the random scores spread (parity on near-constant scores would prove little)
    for name, seed in (("raw-cross-encoder", 1), ("ce-identity-src", 2)):
        torch.manual_seed(seed)
        BertForSequenceClassification(_bert(tok, num_labels=1, initializer_range=0.2)).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    ce = CrossEncoder(str(root / "ce-identity-src"), max_length=MAX_LEN, activation_fn=torch.nn.Identity())
    ce.save(str(root / "cross-encoder"))
    return {"bi": root / "bi-encoder", "ce": root / "cross-encoder", "raw": root / "raw-cross-encoder"}


@pytest.fixture(scope="module")
def artifacts(local_models, tmp_path_factory) -> Path:
    """The three exported by the command lines, into one models directory."""
    from training.cli import export, export_reranker

    models_dir = tmp_path_factory.mktemp("byom-models")
    bi = ["--model", str(local_models["bi"]), "--output", str(models_dir / "my-encoder"), "--eval", "none"]
    assert export.main(bi) == 0
    assert export_reranker.main(["--model", str(local_models["ce"]), "--out", str(models_dir / "my-reranker")]) == 0
    raw = ["--model", str(local_models["raw"]), "--out", str(models_dir / "raw-reranker"), "--name", "raw-reranker"]
    assert export_reranker.main(raw) == 0
    return models_dir


@pytest.fixture(scope="module")
def client(artifacts, tmp_path_factory):
    args = [
        "--default-model",
        "my-encoder",
        "--rerank-models",
        "my-reranker,raw-reranker",
        "--intra-op-threads",
        "1",
        "--log-level",
        "warning",
    ]
    with run_server(artifacts, workdir=tmp_path_factory.mktemp("byom-srv"), args=args) as srv:
        with httpx.Client(base_url=srv.url, timeout=60.0) as c:
            yield c
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def claim():
    """A SciFact claim with its judged abstracts and others (over 48 tokens: truncated, longest side first)."""
    from training.data.scifact import load_scifact

    data = load_scifact(max_queries=3, max_corpus=40, seed=7)
    q = sorted(data.qrels)[0]
    docs = [data.corpus[d] for d in sorted(data.qrels[q])] + [
        t for d, t in data.corpus.items() if d not in data.qrels[q]
    ][:7]
    return data.queries[q], docs


def _close(got: np.ndarray, ref: np.ndarray) -> None:
    assert np.abs(got - ref).max() <= 1e-4, np.abs(got - ref).max()
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.9999, cos.min()


def test_the_current_pooling_format_is_read(local_models):
    cfg = json.loads((local_models["bi"] / "1_Pooling" / "config.json").read_text())
    assert cfg.get("pooling_mode") == "mean" and "pooling_mode_mean_tokens" not in cfg  # the format under test
    st = read_st_config(local_models["bi"])
    assert (st.pooling, st.normalize, st.max_seq_length, st.unsupported) == ("mean", True, MAX_LEN, ())


def test_bi_encoder_manifest_follows_the_directory(artifacts):
    m = validate_artifact(artifacts / "my-encoder")
    assert (m.pooling, m.normalize, m.max_seq_length, m.dimension) == ("mean", True, MAX_LEN, 32)
    assert (m.prompts, m.default_prompt_name) == (PROMPTS, "query")
    assert m.parity.max_abs_diff <= 1e-4 and m.parity.min_cosine >= 0.9999


def test_served_embeddings_equal_sentence_transformers_encode(client, local_models):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(local_models["bi"]), device="cpu")
    for prompt_name in (None, "document"):  # the default prompt ("query: "), then the empty one
        body = {"inputs": SENTENCES} | ({"prompt_name": prompt_name} if prompt_name else {})
        r = client.post("/embed", json=body)
        assert r.status_code == 200, r.text
        _close(np.asarray(r.json(), np.float32), st.encode(SENTENCES, prompt_name=prompt_name))


def test_rerankers_record_their_activation(artifacts):
    ce, raw = validate_artifact(artifacts / "my-reranker"), validate_artifact(artifacts / "raw-reranker")
    assert (ce.task, ce.activation, ce.max_seq_length) == ("reranker", "identity", MAX_LEN)
    assert (raw.task, raw.activation, raw.max_seq_length) == ("reranker", "sigmoid", 128)
    for m in (ce, raw):
        assert m.parity.max_abs_diff <= 1e-4 and m.parity.source.startswith("SciFact train, 64")


def test_served_scores_equal_cross_encoder_predict(client, local_models, claim):
    import torch
    from sentence_transformers import CrossEncoder

    query, docs = claim
    pairs = [(query, d) for d in docs]
    for name, ce_dir in (("my-reranker", local_models["ce"]), ("raw-reranker", local_models["raw"])):
        ce = CrossEncoder(str(ce_dir), device="cpu")
        raw = ce.predict(pairs, activation_fn=torch.nn.Identity())
        assert np.ptp(raw) > 0.05, raw  # the scores differ: the comparison can tell pairs apart
        r = client.post("/rerank", json={"model": name, "query": query, "texts": docs, "raw_scores": True})
        assert r.status_code == 200, r.text
        served = np.empty(len(docs))
        for item in r.json():
            served[item["index"]] = item["score"]
        assert np.abs(served - raw).max() <= 1e-4, (name, served, raw)
    # the sigmoid CrossEncoder's own scores are what Cohere's relevance_score carries
    ce = CrossEncoder(str(local_models["raw"]), device="cpu")
    r = client.post("/v1/rerank", json={"model": "raw-reranker", "query": query, "documents": docs})
    assert r.status_code == 200, r.text
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert np.abs(np.array([got[i] for i in range(len(docs))]) - ce.predict(pairs)).max() <= 1e-4


@pytest.mark.parametrize("mode", ["max", "lasttoken", ["mean", "cls"]])
def test_unsupported_pooling_is_refused_by_name(local_models, tmp_path, mode):
    from training.export import ExportError, export_artifact

    d = tmp_path / "bi"
    shutil.copytree(local_models["bi"], d)
    cfg = json.loads((d / "1_Pooling" / "config.json").read_text())
    (d / "1_Pooling" / "config.json").write_text(json.dumps(cfg | {"pooling_mode": mode}))
    with pytest.raises(ExportError, match="is not supported: only mean or cls pooling can be exported"):
        export_artifact(d, tmp_path / "art", name="x", evaluate="none")
    assert not (tmp_path / "art" / "manifest.json").exists()


def test_older_formats_and_missing_normalize(local_models, tmp_path):
    d = tmp_path / "bi"
    shutil.copytree(local_models["bi"], d)
    legacy = {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    (d / "1_Pooling" / "config.json").write_text(json.dumps(legacy))
    modules = [m for m in json.loads((d / "modules.json").read_text()) if not m["type"].endswith("Normalize")]
    (d / "modules.json").write_text(json.dumps(modules))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40, "do_lower_case": False}))
    st = read_st_config(d)
    assert (st.pooling, st.normalize, st.max_seq_length) == ("cls", False, 40)
    modules.insert(1, {"idx": 9, "name": "9", "path": "9_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    (d / "modules.json").write_text(json.dumps(modules))
    assert read_st_config(d).unsupported == ("LayerNorm (module 9)",)


def test_export_reranker_refuses_what_is_not_a_cross_encoder(local_models, tmp_path, capsys):
    from training.cli import export_reranker

    assert export_reranker.main(["--model", str(local_models["bi"]), "--out", str(tmp_path / "x")]) == 1
    assert "not a sequence-classification model directory" in capsys.readouterr().out
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_a_model_without_segment_ids_exports_and_quantizes(default_model_dir, tmp_path):
    """A RoBERTa-style cross-encoder (no ``token_type_ids`` from its tokenizer, one token type; bge-reranker is
    XLM-R) through ``export-reranker --quantize int8``: the fp32 graph made on the way is held to ``CrossEncoder
    .predict`` (1e-4, else no artifact), the int8 twin records its parity against it and keeps the activation."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

    from training.cli import export_reranker

    tok = AutoTokenizer.from_pretrained(str(default_model_dir), model_input_names=["input_ids", "attention_mask"])
    cfg = RobertaConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_LEN + 2,
        type_vocab_size=1,
        pad_token_id=tok.pad_token_id,
        num_labels=1,
        initializer_range=0.2,
    )
    torch.manual_seed(3)
    RobertaForSequenceClassification(cfg).save_pretrained(tmp_path / "src")
    tok.save_pretrained(tmp_path / "src")
    CrossEncoder(str(tmp_path / "src"), max_length=MAX_LEN).save(str(tmp_path / "roberta-ce"))
    out = tmp_path / "models" / "roberta-ce-int8"
    assert export_reranker.main(["--model", str(tmp_path / "roberta-ce"), "--out", str(out), "--quantize", "int8"]) == 0
    m = validate_artifact(out)
    assert (m.name, m.quantization, m.activation, m.max_seq_length) == ("roberta-ce-int8", "int8", "sigmoid", MAX_LEN)
    assert "int8 vs fp32 ONNX" in m.parity.source and m.parity.n_sentences == 64


def test_export_reranker_fp16_twin_for_gpu_serving(local_models, tmp_path, capsys):
    """``export-reranker --dtype fp16``: the fp16 twin of the cross-encoder (``dtype: fp16``, int64 inputs and float32
    ``logits`` kept), its raw scores within 0.05 of the fp32 graph's on the parity pairs (both on ONNX Runtime's CPU
    provider), the canary held to 0.05; the service refuses it on a CPU (PrecisionUnsupported), as fp16 encoders;
    ``--quantize int8`` with ``--dtype fp16`` is a usage error."""
    import onnx

    from service.inference.onnx_encoder import PrecisionUnsupported
    from service.inference.onnx_reranker import open_model
    from training.cli import export_reranker
    from training.export.reranker import CANARY_PAIRS, onnx_pair_scores

    out = tmp_path / "models" / "ce-fp16"
    assert export_reranker.main(["--model", str(local_models["ce"]), "--out", str(out), "--dtype", "fp16"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "fp16"
    m = validate_artifact(out)
    assert (m.task, m.dtype, m.quantization, m.activation, m.max_seq_length) == (
        "reranker",
        "fp16",
        None,
        "identity",
        MAX_LEN,
    )
    assert "fp16 vs fp32 ONNX" in m.parity.source and m.parity.n_sentences == 64 and m.parity.max_abs_diff <= 0.05
    assert m.canary.atol == 0.05
    g = onnx.load(str(out / "model.onnx"))
    weights = {onnx.TensorProto.DataType.Name(t.data_type) for t in g.graph.initializer}
    assert "FLOAT16" in weights
    assert [i.type.tensor_type.elem_type for i in g.graph.input] == [onnx.TensorProto.INT64] * 2
    assert g.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert m.parity.max_abs_diff > 0  # the graph computes in fp16: not the fp32 graph again
    fp32 = tmp_path / "fp32"
    assert export_reranker.main(["--model", str(local_models["ce"]), "--out", str(fp32)]) == 0
    diff = np.abs(onnx_pair_scores(out, CANARY_PAIRS) - onnx_pair_scores(fp32, CANARY_PAIRS)).max()
    assert 0 < diff <= 0.05
    with pytest.raises(PrecisionUnsupported, match="CUDAExecutionProvider"):
        open_model(out, providers=["CPUExecutionProvider"], intra_op_threads=1)
    assert export_reranker.main(["--model", str(local_models["ce"]), "--quantize", "int8", "--dtype", "fp16"]) == 2
