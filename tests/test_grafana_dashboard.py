"""The provisioned Grafana dashboard and the collection metrics, against the live service.

No Grafana can run here, so the dashboard is checked where it can break: every PromQL expression of
``docker/grafana/dashboards/embed.json`` is parsed (``promql-parser``, the Rust PromQL parser's Python binding)
and must name only metrics and labels that the real service exports after real traffic (STS-B sentences in a
flat, an HNSW and an IVF-PQ collection, searches, embeddings, a 413, 429s, a hot-swap that re-embeds the
collections): every selector's metric, every matcher's label (and, for ``=``, a value seen), every
``by``/``on``/``group_left`` label, every ``{{label}}`` of a legend among the query's output labels, one-to-one
operands with equal label sets, and ``rate`` only over counters and histograms. The ``embed_collection_*``
gauges and histograms are checked against ``GET /collections/{name}`` and the traffic sent.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import promql_parser as promql
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.artifact_utils import NAME, versioned_copy
from tests.server_utils import REPO_ROOT, run_server
from training.data.sts import load_stsb

pytestmark = pytest.mark.timeout(900)

GRAFANA = REPO_ROOT / "docker" / "grafana"
ADMIN = {"Authorization": "Bearer grafana-test-admin"}
N_POINTS = 240
CHUNK = 80
N_SEARCHES = 5
INDEXES = {"flat": {}, "hnsw": {"M": 16}, "ivf_pq": {"nlist": 4, "m": 8, "nbits": 4}}
RATE_FUNCS = {"rate", "irate", "increase"}
# room for the 3 collections' concurrent re-embedding calls; a burst of BURST concurrent requests overflows it
QUEUE = 2  # small, so bursts get 429s; re-embedding three collections still completes (it waits out a full queue)
BURST = 12


def _exprs_module():
    sys.path.insert(0, str(GRAFANA))
    try:
        import exprs
    finally:
        sys.path.pop(0)
    return exprs


def dashboard_expressions() -> list[dict[str, str]]:
    exprs = _exprs_module()
    return exprs.expressions(json.loads(exprs.DASHBOARD.read_text()))


# --- the exported metrics --------------------------------------------------------------------------------------
class Exported:
    """What a ``/metrics`` text exports: sample name -> {label: values seen}, and each sample's family type."""

    def __init__(self, text: str) -> None:
        self.labels: dict[str, dict[str, set[str]]] = {}
        self.kind: dict[str, str] = {}
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                d = self.labels.setdefault(s.name, {})
                for k, v in s.labels.items():
                    d.setdefault(k, set()).add(v)
                self.kind[s.name] = fam.type
                self.values[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def value(self, name: str, **labels: str) -> float:
        """The sample ``name{labels}`` (KeyError when it is not exported)."""
        return self.values[(name, tuple(sorted(labels.items())))]

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {k[1]: v for k, v in self.values.items() if k[0] == name}


# --- the PromQL checker ----------------------------------------------------------------------------------------
def check_expression(expr: str, legend: str, exported: Exported) -> list[str]:
    """Problems of one dashboard expression against the exported metrics (empty list: none).

    Output labels are tracked bottom-up through the AST; a scalar is ``None``.
    """
    problems: list[str] = []

    def selector_name(vs) -> str | None:
        if vs.name:
            return vs.name
        return next((m.value for m in vs.matchers.matchers if m.name == "__name__"), None)

    def labels_of(node) -> set[str] | None:
        if isinstance(node, promql.VectorSelector):
            name = selector_name(node)
            if name not in exported.labels:
                problems.append(f"metric {name!r} is not exported")
                return set()
            have = exported.labels[name]
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    continue
                if m.name not in have:
                    problems.append(f"{name} has no label {m.name!r} (has {sorted(have)})")
                elif m.op == promql.MatchOp.Equal and m.value not in have[m.name]:
                    problems.append(f"{name}{{{m.name}={m.value!r}}}: value never exported ({sorted(have[m.name])})")
            return set(have)
        if isinstance(node, promql.MatrixSelector):
            return labels_of(node.vector_selector)
        if isinstance(node, (promql.ParenExpr, promql.UnaryExpr, promql.SubqueryExpr)):
            return labels_of(node.expr)
        if isinstance(node, (promql.NumberLiteral, promql.StringLiteral)):
            return None
        if isinstance(node, promql.AggregateExpr):
            inner = labels_of(node.expr) or set()
            mod = node.modifier
            if mod is None:
                return set()
            wanted = set(mod.labels)
            if not wanted <= inner:
                problems.append(
                    f"{node.op} by/without {sorted(wanted - inner)}: not labels of its input {sorted(inner)}"
                )
            return wanted if mod.type == promql.AggModifierType.By else inner - wanted
        if isinstance(node, promql.Call):
            fn = node.func.name
            args = [labels_of(a) for a in node.args]
            if fn in RATE_FUNCS:
                name = selector_name(node.args[0].vector_selector)
                if exported.kind.get(name) not in ("counter", "histogram"):
                    problems.append(f"{fn}() over {name}, a {exported.kind.get(name)}: rate needs a counter")
            if fn == "histogram_quantile":
                if "le" not in (args[1] or set()):
                    problems.append("histogram_quantile over series without an 'le' label")
                return (args[1] or set()) - {"le"}
            if fn == "label_replace":
                return (args[0] or set()) | {node.args[1].val}
            if fn in ("scalar", "time"):
                return None
            return next((a for a in args if a is not None), None)
        if isinstance(node, promql.BinaryExpr):
            lhs, rhs = labels_of(node.lhs), labels_of(node.rhs)
            if lhs is None or rhs is None:
                return lhs if rhs is None else rhs
            mod = node.modifier
            matching = mod.matching if mod is not None else None
            if str(node.op) in ("and", "or", "unless"):
                return lhs | rhs if str(node.op) == "or" else lhs
            if matching is None:
                if lhs != rhs:
                    problems.append(f"one-to-one '{node.op}' between label sets {sorted(lhs)} and {sorted(rhs)}")
                return lhs
            on = set(matching.labels)
            if matching.type == promql.LabelModifierType.Include and not (on <= lhs and on <= rhs):
                problems.append(f"on({sorted(on)}) not on both sides ({sorted(lhs)}, {sorted(rhs)})")
            group = set(mod.group_labels or [])
            if not group <= (rhs | lhs):
                problems.append(f"group_left/right labels {sorted(group)} not exported")
            return lhs | group
        problems.append(f"unhandled PromQL node {type(node).__name__}")
        return set()

    try:
        ast = promql.parse(expr)
    except Exception as e:
        return [f"does not parse: {e}"]
    out = labels_of(ast) or set()
    for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
        if label not in out:
            problems.append(f"legend {{{{{label}}}}} is not an output label ({sorted(out)})")
    return problems


# --- the live service and its traffic ---------------------------------------------------------------------------
def _burst_429(c: httpx.Client, texts: list[str]) -> int:
    """Concurrent /embed requests against a queue of QUEUE until some are refused; returns the 429s seen."""
    for _ in range(10):
        codes: list[int] = []

        def one(codes: list[int] = codes) -> None:
            codes.append(c.post("/embed", json={"inputs": texts}).status_code)

        threads = [threading.Thread(target=one) for _ in range(BURST)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(codes) <= {200, 429}, codes
        if 429 in codes:
            return codes.count(429)
    raise AssertionError(f"no 429 from 10 bursts of {BURST} concurrent requests against max_queue_size={QUEUE}")


def _sequences(info: dict) -> dict:
    return {k: (x["sequence"], x["snapshot_sequence"]) for k, x in info.items()}


@pytest.fixture(scope="module")
def live(default_artifact, tmp_path_factory):
    """The real service after real traffic: ``{"metrics": Exported, "info": {name: collection info}, ...}``."""
    root = tmp_path_factory.mktemp("grafana")
    models = root / "models"
    versioned_copy(default_artifact, models, NAME, "1")
    args = ["--default-model", NAME, "--admin-api-keys", ADMIN["Authorization"].split()[1]]
    args += ["--max-client-batch-size", "64", "--max-queue-size", str(QUEUE), "--log-level", "warning"]
    test = load_stsb("test")
    sentences = list(dict.fromkeys(test.sent1 + test.sent2))[:N_POINTS]
    with run_server(models, workdir=root, args=args) as srv, httpx.Client(base_url=srv.url, timeout=180) as c:
        for kind, params in INDEXES.items():
            name = f"sts-{kind.replace('_', '')}"
            assert c.put(f"/collections/{name}", json={"index": kind, "params": params}).status_code == 200
            for i in range(0, N_POINTS, CHUNK):
                pts = [{"id": j, "text": sentences[j], "payload": {"row": j}} for j in range(i, i + CHUNK)]
                r = c.put(f"/collections/{name}/points", json={"points": pts})
                assert r.status_code == 200, r.text
            for q in test.sent1[-N_SEARCHES:]:
                assert c.post(f"/collections/{name}/search", json={"query": q, "top_k": 5}).status_code == 200
            searches = [{"query": q, "top_k": 3} for q in test.sent2[-4:]]
            assert c.post(f"/collections/{name}/search/batch", json={"searches": searches}).status_code == 200
        assert c.post("/v1/embeddings", json={"input": sentences[:16]}).status_code == 200
        pairs = [[a, b] for a, b in zip(test.sent1[:8], test.sent2[:8])]
        assert c.post("/similarity", json={"pairs": pairs}).status_code == 200
        assert c.post("/embed", json={"inputs": sentences[:65]}).status_code == 413  # max_client_batch_size 64
        n429 = _burst_429(c, sentences[:64])
        # hot-swap: publish minilm:2, activate it; every collection is re-embedded in the background
        versioned_copy(default_artifact, models, NAME, "2")
        r = c.post(f"/admin/models/{NAME}/activate", json={"version": "2"}, headers=ADMIN)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 300
        while True:
            info = {x["name"]: x for x in c.get("/collections").json()["collections"]}
            states = {k: (x["reembedding"] or {}).get("state") for k, x in info.items()}
            if set(states.values()) == {"completed"}:
                break
            assert "failed" not in states.values() and time.monotonic() < deadline, {
                k: x["reembedding"] for k, x in info.items()
            }
            time.sleep(0.5)
        while True:  # a background snapshot may land between two reads: read until the write counters hold still
            before = _sequences(info)
            text = c.get("/metrics").text
            info = {x["name"]: x for x in c.get("/collections").json()["collections"]}
            if _sequences(info) == before:
                break
        yield {"metrics": Exported(text), "info": info, "n429": n429}


# --- tests ------------------------------------------------------------------------------------------------------
def test_collection_gauges_match_collection_info(live) -> None:
    m, info = live["metrics"], live["info"]
    assert set(info) == {"sts-flat", "sts-hnsw", "sts-ivfpq"}
    for name, x in info.items():
        kind = x["index"]["type"]
        assert m.value("embed_collection_points", collection=name, index=kind) == x["count"] == N_POINTS
        assert m.value("embed_collection_index_vectors", collection=name, index=kind) == x["index"]["vectors"]
        assert m.value("embed_collection_index_tombstones", collection=name, index=kind) == x["index"]["tombstones"]
        assert m.value("embed_collection_index_trained", collection=name, index=kind) == int(x["index"]["trained"])
        assert m.value("embed_collection_info", collection=name, index=kind, metric="cosine", model=NAME, version="2")
        writes = m.value("embed_collection_writes_since_snapshot", collection=name)
        assert writes == x["sequence"] - x["snapshot_sequence"]
        assert m.value("embed_collection_snapshot_age_seconds", collection=name) >= 0
        # the re-embedding towards minilm:2 is complete: every point done
        assert m.value("embed_collection_reembed_done", collection=name) == N_POINTS
        assert m.value("embed_collection_reembed_total", collection=name) == N_POINTS
        states = {dict(k)["state"]: v for k, v in m.series("embed_collection_reembed_state").items()
                  if dict(k)["collection"] == name}  # fmt: skip
        assert states == {"none": 0, "running": 0, "completed": 1, "cancelled": 0, "failed": 0}
    # ivf_pq with 240 points < min_train_points: untrained, served exactly until then
    assert m.value("embed_collection_index_trained", collection="sts-ivfpq", index="ivf_pq") == 0


def test_collection_latency_histograms_count_the_traffic_by_index_type(live) -> None:
    m = live["metrics"]
    for kind in INDEXES:
        count = "embed_collection_search_duration_seconds_count"
        assert m.value(count, index=kind, operation="search") == N_SEARCHES
        assert m.value(count, index=kind, operation="search_batch") == 1
        assert m.value("embed_collection_upsert_duration_seconds_count", index=kind) == N_POINTS // CHUNK
        assert m.value("embed_collection_search_duration_seconds_sum", index=kind, operation="search") > 0
    assert m.value("embed_requests_total", route="/embed", method="POST", status="429") == live["n429"]
    assert m.value("embed_requests_total", route="/embed", method="POST", status="413") == 1


def test_every_dashboard_expression_uses_exported_metrics_and_labels(live) -> None:
    exprs = dashboard_expressions()
    assert len(exprs) >= 25
    bad = {
        f"{e['panel']} [{e['ref']}] {e['expr']}": p
        for e in exprs
        if (p := check_expression(e["expr"], e["legend"], live["metrics"]))
    }
    assert not bad, json.dumps(bad, indent=1)


def test_the_checker_catches_broken_expressions(live) -> None:
    """The checker is not vacuous: each kind of mistake in a dashboard expression is reported."""
    m = live["metrics"]
    broken = {
        "sum by (route) (rate(embed_request_total[1m]))": "not exported",  # typo in the metric
        'sum(rate(embed_requests_total{code="429"}[1m]))': "no label 'code'",
        'sum(rate(embed_requests_total{status="418"}[1m]))': "value never exported",
        "sum by (index) (rate(embed_requests_total[1m]))": "not labels of its input",
        "histogram_quantile(0.9, sum by (route) (rate(embed_request_duration_seconds_bucket[1m])))": "'le'",
        "rate(embed_collection_points[1m])": "rate needs a counter",
        "sum by (model) (embed_queue_size) / sum by (route) (rate(embed_requests_total[1m]))": "one-to-one",
        "sum by (le, route) (rate(embed_request_duration_seconds_bucket[1m]": "does not parse",
    }
    for expr, why in broken.items():
        problems = check_expression(expr, "", m)
        assert any(why in p for p in problems), (expr, problems)
    assert "legend {{index}}" in check_expression("sum by (route) (rate(embed_requests_total[1m]))", "{{index}}", m)[0]
    ok = "histogram_quantile(0.99, sum by (le, index) (rate(embed_collection_search_duration_seconds_bucket[1m])))"
    assert check_expression(ok, "p99 {{index}}", m) == []


def test_dashboard_covers_the_service(live) -> None:
    """The panels the deployment needs are there, each with its metric."""
    text = " ".join(e["expr"] for e in dashboard_expressions())
    for needed in (
        "embed_requests_total",  # request rate per route
        "embed_request_duration_seconds_bucket",  # p50/p99 per route
        'status="429"',
        'status="413"',
        "embed_queue_size",
        "embed_batch_size_bucket",
        "embed_batch_tokens_bucket",
        "embed_inference_duration_seconds_bucket",
        'embed_model_info{active="true"}',
        "embed_collection_points",
        "embed_collection_search_duration_seconds_bucket",
        "embed_collection_upsert_duration_seconds_bucket",
        "embed_collection_reembed_done",
        "embed_collection_reembed_total",
        "embed_collection_snapshot_age_seconds",
        "embed_collection_writes_since_snapshot",
    ):
        assert needed in text, needed


def test_provisioning_wires_the_dashboard_to_the_prometheus_datasource() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert len(ds) == 1 and ds[0]["type"] == "prometheus" and ds[0]["url"] == "http://prometheus:9090"
    dash = json.loads((GRAFANA / "dashboards" / "embed.json").read_text())
    exprs = _exprs_module()
    for p in exprs.panels(dash):
        assert p["datasource"] == {"type": "prometheus", "uid": ds[0]["uid"]}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == ds[0]["uid"], p["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "embed.yml").read_text())["providers"][0]
    compose = yaml.safe_load((REPO_ROOT / "docker" / "docker-compose.yml").read_text())["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in compose["volumes"]}
    assert Path(REPO_ROOT / "docker" / mounts[provider["options"]["path"]]).resolve() == (GRAFANA / "dashboards")
    assert (REPO_ROOT / "docker" / mounts["/etc/grafana/provisioning"]).resolve() == GRAFANA / "provisioning"
