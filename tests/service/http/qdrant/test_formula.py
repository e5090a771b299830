"""Qdrant's score-boosting ``formula`` query (Qdrant documentation, "Hybrid and Multi-Stage Queries": "Score
boosting"), held to qdrant-client's local mode (the oracle):

* the core evaluator (:mod:`service.collections.formula`, the conditions translated by ``service.http.qdrant.filters``)
  against the local mode's ``evaluate_expression`` on random expressions (as qdrant-client's own
  ``one_random_expression_please`` makes them) over points with varied payloads: the same float32 score, or an error
  of the same kind;
* whole queries through ``/qdrant`` over REST and gRPC against ``QdrantClient(":memory:")``: random formulas over
  two prefetches (a vector search and a query-less one), ``has_vector`` conditions, ``score_threshold``, limits, and
  every error case (division by zero with and without ``by_zero_default``, non-finite results, a missing variable
  with and without a default, a value of the wrong type, malformed formulas, a formula without prefetches): 4xx with
  Qdrant's message phrases, the same over gRPC.

The native API has no query tree with prefetches (only ``mode: hybrid``), so it has no formula to test.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from service.collections.filters import parse_filter
from service.collections.formula import FormulaSpec, map_conditions, parse
from service.http.qdrant.filters import translate
from tests.server_utils import free_port, run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import UnexpectedResponse  # noqa: E402
from qdrant_client.hybrid.formula import evaluate_expression, parse_defaults, validate_expression  # noqa: E402

N = 40
DEEP: object = 1.0
for _ in range(40):
    DEEP = {"neg": DEEP}
WORDS = ["ape", "wolf", "cat", "dog", "bee", "fox"]
VARIABLES = ["n", "digit", "signed", "nested.digit", "$score", "$score[0]", "$score[1]", "mixed", "maybe", "arr[]"]
DEFAULTS = {"digit": 5, "mixed": 0.3, "maybe": [], "city.geo": {"lat": 0.5, "lon": 0.4}, "$score[1]": 0.25}


def payload(rng: random.Random, i: int) -> dict:
    """Numbers, nested numbers, datetimes (several formats, some not datetimes), geo points (some missing or not a
    point) and a key of every JSON type."""
    p: dict = {"n": round(rng.random(), 5), "digit": rng.randint(0, 9), "signed": rng.randint(-10, 10),
               "nested": {"digit": rng.randint(0, 9)}, "words": " ".join(rng.sample(WORDS, 2)),
               "tags": rng.sample(WORDS, rng.randint(0, 3)), "arr": [rng.randint(0, 5)] * rng.randint(0, 2)}  # fmt: skip
    p["dt"] = rng.choice([f"2000-01-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:30:00Z",
                          f"2000-02-{rng.randint(1, 28):02d} 10:00:00+03:00", "2000-03-01", "not a date"])  # fmt: skip
    if i % 6:
        p["city"] = {"geo": {"lat": rng.uniform(-60, 60), "lon": rng.uniform(-170, 170)}}
    elif i % 12 == 0:
        p["city"] = {"geo": "nowhere"}
    p["mixed"] = rng.choice([None, "word", rng.randint(0, 9), [1, 2, 3], round(rng.random(), 5), [0.5], True, {"k": 1}])
    if rng.random() < 0.5:
        p["maybe"] = rng.randint(1, 3)
    return p


def condition(rng: random.Random) -> models.Condition:
    kind = rng.choice(["value", "any", "range", "has_id", "empty", "text", "radius", "count", "filter", "vector"])
    if kind == "value":
        return models.FieldCondition(key="tags", match=models.MatchValue(value=rng.choice(WORDS)))
    if kind == "any":
        return models.FieldCondition(key="words", match=models.MatchAny(any=rng.sample(WORDS, 2)))
    if kind == "range":
        return models.FieldCondition(key="digit", range=models.Range(gte=rng.randint(0, 5), lt=rng.randint(4, 10)))
    if kind == "has_id":
        return models.HasIdCondition(has_id=rng.sample(range(N), 10))
    if kind == "empty":
        return models.IsEmptyCondition(is_empty=models.PayloadField(key="tags"))
    if kind == "text":
        return models.FieldCondition(key="words", match=models.MatchText(text=rng.choice(WORDS)))
    if kind == "radius":
        return models.FieldCondition(key="city.geo", geo_radius=models.GeoRadius(
            center=models.GeoPoint(lat=0.0, lon=0.0), radius=rng.uniform(1e6, 1e7)))  # fmt: skip
    if kind == "count":
        return models.FieldCondition(key="tags", values_count=models.ValuesCount(gte=rng.randint(0, 3)))
    if kind == "vector":
        return models.HasVectorCondition(has_vector="w")
    return models.Filter(should=[condition(rng), condition(rng)], must_not=[condition(rng)])


def expression(rng: random.Random, depth: int = 0, max_depth: int = 3) -> models.Expression:
    """A random expression, as qdrant-client's ``one_random_expression_please`` makes them (plus max, min,
    acosh)."""

    def sub() -> models.Expression:
        return expression(rng, depth + 1, max_depth)

    def decay() -> models.DecayParamsExpression:
        return models.DecayParamsExpression(x=expression(rng, max_depth, max_depth),
                                            target=expression(rng, max_depth, max_depth) if rng.random() < 0.8 else None,
                                            midpoint=round(rng.uniform(0.00001, 0.99999), 5),
                                            scale=round(rng.uniform(0.001, 1e5), 5))  # fmt: skip

    terminals = [
        lambda: round(rng.uniform(-10, 10), 5),
        lambda: rng.choice(VARIABLES),
        lambda: condition(rng),
        lambda: models.GeoDistance(
            geo_distance=models.GeoDistanceParams(
                origin=models.GeoPoint(lat=round(rng.uniform(-90, 90), 5), lon=round(rng.uniform(-180, 180), 5)),
                to="city.geo",
            )
        ),  # fmt: skip
        lambda: models.DatetimeExpression(datetime=rng.choice(["2000-01-15T00:00:00Z", "2000-02-01 12:00:00+01:00"])),
        lambda: models.DatetimeKeyExpression(datetime_key="dt"),
    ]
    nested = [
        lambda: models.MultExpression(mult=[sub() for _ in range(rng.randint(2, 3))]),
        lambda: models.SumExpression(sum=[sub() for _ in range(rng.randint(2, 3))]),
        lambda: models.MaxExpression(max=[sub() for _ in range(rng.randint(1, 3))]),
        lambda: models.MinExpression(min=[sub() for _ in range(rng.randint(1, 3))]),
        lambda: models.NegExpression(neg=sub()),
        lambda: models.AbsExpression(abs=sub()),
        lambda: models.DivExpression(
            div=models.DivParams(left=sub(), right=sub(), by_zero_default=rng.choice([None, round(rng.random(), 5)]))
        ),  # fmt: skip
        lambda: models.SqrtExpression(sqrt=sub()),
        lambda: models.PowExpression(pow=models.PowParams(base=sub(), exponent=sub())),
        lambda: models.ExpExpression(exp=sub()),
        lambda: models.Log10Expression(log10=sub()),
        lambda: models.LnExpression(ln=sub()),
        lambda: models.AcoshExpression(acosh=sub()),
        lambda: models.LinDecayExpression(lin_decay=decay()),
        lambda: models.ExpDecayExpression(exp_decay=decay()),
        lambda: models.GaussDecayExpression(gauss_decay=decay()),
    ]
    if depth >= max_depth:
        return rng.choice(terminals)()
    return rng.choice(terminals + nested)()


def dump(x: object) -> object:
    """The JSON a REST client sends for a model (or a constant, a variable)."""
    return x.model_dump(mode="json", exclude_none=True) if hasattr(x, "model_dump") else x


def kind(e: BaseException) -> str:
    """The kind of a formula error, as qdrant-client's congruence test ``test_formula_query`` compares them."""
    s = str(e)
    if "produced a non-finite number" in s or "math domain error" in s:
        return "non-finite"
    if "in the payload and/or in the formula defaults" in s or "in the payload nor the formula defaults" in s:
        return "payload"
    raise AssertionError(f"not a formula error: {type(e).__name__}: {s}")


def core_formula(expr: models.Expression, defaults: dict):
    """The core's parsed formula of a Qdrant expression, as ``service.http.qdrant.prefetch`` makes it."""

    def cond(c: dict, at: str) -> object:
        where = translate({"must": [c]}, at)
        return 1.0 if where is None else {"filter": where}

    spec = FormulaSpec(map_conditions(dump(expr), cond, "query.formula"), defaults)
    return parse(spec, lambda raw, at: parse_filter(raw, 1024, {"v": "dense", "w": "dense"}) if raw else None)


def test_random_formulas_score_as_local_mode():
    rng = random.Random(7)
    payloads = [payload(rng, i) for i in range(N)]
    holds_w = tuple(i for i in range(N) if i % 3)
    scores = [{i: round(rng.uniform(-1, 1), 4) for i in range(N) if i % 4}, {i: rng.random() for i in range(0, N, 2)}]
    checked = {"value": 0, "non-finite": 0, "payload": 0}
    for _ in range(300):
        expr, defaults = expression(rng), DEFAULTS if rng.random() < 0.6 else {}
        validate_expression(expr)
        ours = core_formula(expr, defaults).bind_vectors({"w": holds_w})
        for i in rng.sample(range(N), 12):
            try:
                with np.errstate(all="ignore"):
                    want = np.float32(evaluate_expression(expr, i, scores, payloads[i], {"v": True, "w": i in holds_w},
                                                          parse_defaults(defaults)))  # fmt: skip
                want = want if np.isfinite(want) else ValueError("produced a non-finite number")
            except (ValueError, OverflowError) as e:
                want = e
            try:
                got = ours.score([s.get(i) for s in scores], payloads[i], i)
            except Exception as e:
                assert isinstance(want, BaseException), (expr, payloads[i], e, want)
                assert kind(e) == kind(want), (expr, payloads[i], e, want)
                checked[kind(e)] += 1
                continue
            assert not isinstance(want, BaseException), (expr, payloads[i], got, want)
            assert math.isclose(got, float(want), rel_tol=1e-6, abs_tol=1e-9), (expr, payloads[i], got, want)
            checked["value"] += 1
    assert min(checked.values()) > 50, checked  # every outcome was exercised


@pytest.fixture(scope="module")
def clients(default_artifact: Path, tmp_path_factory):
    """REST and gRPC clients of one service, local mode, and the service's ``/qdrant`` URL; each client with the collection ``fq`` of :data:`N` points
    (vectors ``v``, and ``w`` on two points of three)."""
    port = free_port()
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("formula"),
                    env={"EMBED_QDRANT_GRPC_PORT": str(port)}) as s:  # fmt: skip
        rest = QdrantClient(url=f"{s.url}/qdrant", timeout=60)
        over_grpc = QdrantClient(url=f"{s.url}/qdrant", prefer_grpc=True, grpc_port=port, https=False, timeout=60)
        local = QdrantClient(":memory:")
        rng = random.Random(3)
        points = [models.PointStruct(id=i, payload=payload(rng, i), vector={
            "v": [rng.uniform(-1, 1) for _ in range(4)], **({"w": [1.0, float(i)]} if i % 3 else {})})
            for i in range(N)]  # fmt: skip
        for c in (rest, local):
            c.create_collection("fq", vectors_config={"v": models.VectorParams(size=4, distance=models.Distance.DOT),
                                                      "w": models.VectorParams(size=2, distance=models.Distance.DOT)})  # fmt: skip
            c.upsert("fq", points)
        yield rest, over_grpc, local, f"{s.url}/qdrant"
        rest.close()
        over_grpc.close()


def outcome(c: QdrantClient, **kw: object) -> object:
    """``[(id, score, payload)]`` of a query, or the kind of its error."""
    try:
        return [(p.id, p.score, p.payload) for p in c.query_points("fq", **kw).points]
    except (ValueError, UnexpectedResponse, grpc.RpcError) as e:
        return kind(e)


def same(a: object, b: object) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return [(i, p) for i, _, p in a] == [(i, p) for i, _, p in b] and np.allclose(
        [s for _, s, _ in a], [s for _, s, _ in b], rtol=1e-4, atol=1e-6)  # fmt: skip


def test_formula_queries_over_rest_and_grpc_agree_with_local_mode(clients):
    rest, over_grpc, local, _ = clients
    rng = random.Random(17)
    prefetch = [models.Prefetch(query=[0.5, -0.2, 0.3, 0.1], using="v", limit=15),
                models.Prefetch(filter=models.Filter(must=[models.FieldCondition(key="digit", range=models.Range(
                    gte=4))]), limit=12)]  # fmt: skip
    seen = set()
    for k in range(24):
        expr = expression(rng, max_depth=2)
        q = models.FormulaQuery(formula=expr, defaults=DEFAULTS if k % 2 else {})
        kw = {"prefetch": prefetch, "query": q, "limit": rng.choice([3, 10, 30]), "with_payload": bool(k % 3)}
        if k % 5 == 0:
            kw["score_threshold"] = 0.0
        want, got = outcome(local, **kw), outcome(rest, **kw)
        assert same(got, want), (expr, got, want)
        assert same(outcome(over_grpc, **kw), got), expr
        seen.add(want if isinstance(want, str) else "hits")
    assert seen == {"hits", "non-finite", "payload"}, seen
    holds_w = models.FormulaQuery(formula=models.SumExpression(sum=["$score", models.MultExpression(mult=[
        2.0, models.HasVectorCondition(has_vector="w")])]))  # fmt: skip
    want = outcome(local, prefetch=prefetch, query=holds_w, limit=20)
    assert {i % 3 != 0 for i, _, _ in want} == {True, False}  # points with and without the vector w
    assert same(outcome(rest, prefetch=prefetch, query=holds_w, limit=20), want)
    assert same(outcome(over_grpc, prefetch=prefetch, query=holds_w, limit=20), want)


def test_formula_errors_are_4xx_with_qdrant_messages(clients):
    rest, over_grpc, local, _ = clients
    one = models.Prefetch(filter=models.Filter(must=[models.HasIdCondition(has_id=[1])]), limit=1)  # n, city.geo set

    def run(c: QdrantClient, formula: models.Expression, defaults: dict | None = None, prefetch=one) -> object:
        return outcome(c, prefetch=prefetch, query=models.FormulaQuery(formula=formula, defaults=defaults))

    div = models.DivExpression(div=models.DivParams(left=1.0, right="$score[1]"))
    div_default = models.DivExpression(div=models.DivParams(left=1.0, right="$score[1]", by_zero_default=7.5))
    cases = [
        (div, None, "non-finite"),  # $score[1]: no second prefetch, 0
        (div_default, None, 7.5),
        (models.DivExpression(div=models.DivParams(left=0.0, right="nope")), None, 0.0),  # right not evaluated
        (models.ExpExpression(exp=1000.0), None, "non-finite"),
        (models.SqrtExpression(sqrt=-1.0), None, "non-finite"),
        (models.LnExpression(ln=0.0), None, "non-finite"),
        (models.PowExpression(pow=models.PowParams(base=0.0, exponent=-1.0)), None, "non-finite"),
        (models.MultExpression(mult=[1e30, 1e30]), None, "non-finite"),  # finite as f64, not as f32
        (models.MultExpression(mult=[0.0, "nope"]), None, 0.0),  # stops at a zero factor
        ("nope", None, "payload"),  # missing, no default
        ("nope", {"nope": 2.5}, 2.5),
        ("$score[3]", {"$score[3]": 1.5}, 1.5),
        ("words", None, "payload"),  # a string
        (
            models.GeoDistance(geo_distance=models.GeoDistanceParams(origin=models.GeoPoint(lat=0, lon=0), to="words")),
            None,
            "payload",
        ),  # fmt: skip
        (models.DatetimeKeyExpression(datetime_key="words"), None, "payload"),
    ]
    for formula, defaults, want in cases:
        got = run(rest, formula, defaults)
        oracle = run(local, formula, defaults)
        if isinstance(want, float):
            assert got[0][:1] == oracle[0][:1] == (1,) and got[0][1] == oracle[0][1] == want, (formula, got, oracle)
        else:
            assert got == oracle == want, (formula, got, oracle)
        assert run(over_grpc, formula, defaults) == got, formula
    with pytest.raises(UnexpectedResponse) as e:
        rest.query_points("fq", prefetch=one, query=models.FormulaQuery(formula=models.SqrtExpression(sqrt=-4.0)))
    assert 400 <= e.value.status_code < 500
    assert json.loads(e.value.content)["status"]["error"].endswith("The expression √-4.0 produced a non-finite number")
    with pytest.raises(grpc.RpcError) as g:
        over_grpc.query_points("fq", prefetch=one, query=models.FormulaQuery(formula="words"))
    assert g.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Expected number value for words in the payload and/or in the formula defaults" in g.value.details()


@pytest.mark.parametrize(
    "body",
    [
        {"query": {"formula": "$score"}},  # no prefetch
        {"prefetch": {"limit": 2}, "query": {"formula": {"multt": [1, 2]}}},  # not an operator: a bad condition
        {"prefetch": {"limit": 2}, "query": {"formula": "$score[x]"}},
        {"prefetch": {"limit": 2}, "query": {"formula": "a..b"}},
        {"prefetch": {"limit": 2}, "query": {"formula": {"max": []}}},
        {"prefetch": {"limit": 2}, "query": {"formula": {"exp_decay": {"x": 1, "midpoint": 1.0}}}},
        {"prefetch": {"limit": 2}, "query": {"formula": {"lin_decay": {"x": 1, "scale": 0}}}},
        {"prefetch": {"limit": 2}, "query": {"formula": {"datetime": "yesterday"}}},
        {"prefetch": {"limit": 2}, "query": {"formula": {"div": {"left": 1}}}},
        {"prefetch": {"limit": 2}, "query": {"formula": {"sum": [1, True]}}},
        {"prefetch": {"limit": 2}, "query": {"formula": 1, "defaults": {"$score[": 1}}},
        {"prefetch": {"limit": 2}, "query": {"formula": 1, "defaults": [1]}},
        {"prefetch": {"limit": 2}, "query": {"formula": 1, "extra": 1}},
        {"prefetch": {"limit": 2}, "query": {"formula": DEEP}},  # nested past the limit
    ],
)
def test_malformed_formulas_are_422(clients, body):
    r = httpx.post(f"{clients[3]}/collections/fq/points/query", json=body, timeout=30)
    assert r.status_code == 422 and r.json()["status"]["error"], (body, r.status_code, r.text)
