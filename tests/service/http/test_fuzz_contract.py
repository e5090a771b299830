"""Fuzzing gate: every operation of the live service's OpenAPI document, with generated requests.

Schemathesis generates requests from ``/openapi.json`` (fixed seed, bounded examples) against the real server
(collections pre-created and filled with STS-B sentences, so ``{name}`` paths, and the Qdrant-compatible
surface's ``{collection_name}`` paths, resolve) and checks: no 5xx,
the status is documented, the content type and the body match the documented schema. The server answers
``/health`` afterwards.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from tests.server_utils import run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def fuzz_server(default_artifact: Path, reranker_artifact: Path, tmp_path_factory):
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--log-level", "warning",
            "--rerank-models", reranker_artifact.name,  # the rerank routes answer with a model, not only 404
            "--max-client-batch-size", "64", "--collections-max-points-per-request", "64"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("fuzz"), args=args) as srv:
        s = load_task("STSBenchmark")
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            assert c.put("/collections/fuzz", json={"index": "hnsw"}).status_code == 200
            pts = [{"id": i, "text": t, "payload": {"genre": ["a", "b"][i % 2]}} for i, t in enumerate(s.sent1[:50])]
            assert c.put("/collections/fuzz/points", json={"points": pts}).status_code == 200
        yield srv
        assert httpx.get(f"{srv.url}/health").status_code == 200
        assert srv.alive(), srv.log()[-3000:]


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 10  # derandomized: the same first 10 of the 25 cases run before, every run (suite time)
N_OPERATIONS = 86  # 45 native operations (/rerank, /v1/rerank and /v2/rerank among them), 41 of the Qdrant-compatible surface (/qdrant)


def _fuzz(op, mode: GenerationMode, base_url: str, failures: list[str]) -> int:
    """Run ``EXAMPLES`` generated cases of one operation; returns how many were sent."""
    label = f"{op.method.upper()} {op.path}"
    # the native "{name}" and Qdrant's "{collection_name}" name the pre-filled collection (deletes get random names)
    param = "name" if "{name}" in op.path else "collection_name" if "{collection_name}" in op.path else None
    fixed = {param: "fuzz"} if param and op.method.upper() != "DELETE" else None
    sent = [0]

    @given(case=op.as_strategy(mode, path_parameters=fixed))
    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def run(case):
        sent[0] += 1
        try:
            case.call_and_validate(base_url=base_url, checks=CHECKS)
        except Exception as e:  # keep every operation's failure, not just the first
            failures.append(f"{label}: {str(e)[:600]}")
            raise

    try:
        run()
    except Exception:
        pass
    return sent[0]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_operation_honours_its_contract(fuzz_server, mode):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) == N_OPERATIONS
    failures: list[str] = []
    sent = sum(_fuzz(op, mode, fuzz_server.url, failures) for op in operations)
    assert sent >= N_OPERATIONS * 3, f"only {sent} cases were generated"
    assert httpx.get(f"{fuzz_server.url}/health").status_code == 200
    assert not failures, "\n".join(dict.fromkeys(failures))
