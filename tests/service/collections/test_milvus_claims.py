"""Overlapping re-embedding claims on the milvus backend, made deterministic (real Milvus server, two backends on one
prefix as two replicas would be).

Milvus has no compare-and-set, so two replicas can both believe they hold a claim when one claim's write is slower
than ``claim_settle_s`` (seen under load). Here replica B's claim is ordered before A's after A has already announced
its target: A must notice at its next renewal, B must resume A's announced target (not create another), A's
release must leave that target in place, and B must complete the switch that every replica then sees.
"""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest

from service.collections import open_backend
from service.collections.vector_backend import single_config
from service.settings import Settings
from training.data.sts import load_task

M1 = {"name": "m", "version": "1", "sha256": "1" * 64}
M2 = {"name": "m", "version": "2", "sha256": "2" * 64}
DIM = 16


def _vectors(texts: list[str], salt: int) -> np.ndarray:
    """Deterministic vectors per text (the claim logic under test does not depend on their meaning)."""
    out = np.stack([np.random.default_rng([salt, sum(t.encode())]).standard_normal(DIM) for t in texts])
    return out.astype(np.float32)


def _docs(loop, backend, n: int):
    """Collection ``docs`` on ``backend`` with the first ``n`` distinct STS-B sentences under model M1."""
    texts = list(dict.fromkeys(load_task("STSBenchmark").sent1))[:n]
    c = loop.run_until_complete(backend.create("docs", single_config("docs", "flat", None, "cosine", M1, DIM)))
    c.upsert(list(range(n)), texts, [{"row": i} for i in range(n)], _vectors(texts, 1), model=M1)
    return c, texts


@pytest.fixture()
def replicas(milvus_uri):
    s = Settings(
        collections_backend="milvus", collections_milvus_uri=milvus_uri,
        collections_milvus_prefix=f"k{uuid.uuid4().hex[:10]}_", collections_milvus_refresh_s=0.2,
        collections_milvus_claim_ttl_s=3.0, collections_milvus_claim_settle_s=0.2,
        collections_milvus_write_timeout_s=1.0,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    a, b = open_backend(s), open_backend(s)
    loop.run_until_complete(a.start())
    loop.run_until_complete(b.start())
    yield loop, a, b
    loop.run_until_complete(a.close())
    loop.run_until_complete(b.close())
    loop.close()


def test_overlapping_claims_resolve_to_one_target(replicas):
    loop, a, b = replicas
    ca, texts = _docs(loop, a, 60)

    ta = ca.begin_reembed(M2, DIM, "replica-a")
    assert ta is not None and ta.renew()
    # B's claim, ordered before A's (its write was slow: it reaches Milvus only now)
    assert b.registry.claim("docs", "replica-b", 3.0, at=ta.claimed_at - 1.0) is not None
    assert ta.renew() is False  # A notices at its next renewal
    tb = b.get("docs").begin_reembed(M2, DIM, "replica-b")
    assert tb is not None and tb.new == ta.new  # B resumes A's announced target instead of making another
    ta.abandon(False)
    assert b.physical.exists(tb.new) and not b.registry.retired()  # A's release leaves B's target alone
    assert b.get("docs").begin_reembed(M2, DIM, "replica-a2") is None  # a third replica waits

    cursor = None
    while True:
        rows, cursor = tb.pending(cursor, 25)
        if not rows:
            if tb.complete():
                break
            cursor = None
            continue
        tb.write([r[0] for r in rows], _vectors([r[1] for r in rows], 2))
    tb.abandon(False)
    a.refresh_one("docs")
    for backend in (a, b):
        c = backend.get("docs")
        assert c.model == M2 and c.count == len(texts)
        got = c.get(5, with_vector=True)
        want = _vectors([texts[5]], 2)[0]
        np.testing.assert_allclose(got["vector"], want / np.linalg.norm(want), atol=1e-5)
    assert b.registry.retired()  # the old physical collection is retired once switched


def test_a_read_from_before_the_switch_never_moves_a_view_back(replicas):
    """Registry reads run on several threads: a refresh that read the registry before a switch can apply its result
    after the switch (seen in CI: a collection reported its re-embedding ``completed`` with the old model)."""
    loop, a, _ = replicas
    c, texts = _docs(loop, a, 30)
    tg = c.begin_reembed(M2, DIM, "replica-a")
    tg.publish_status()
    stale_recs, stale_stats = a.registry.records()  # a refresh reads here...
    rows, _ = tg.pending(None, 100)
    tg.write([r[0] for r in rows], _vectors([r[1] for r in rows], 2))
    assert tg.complete()
    tg.status.update(state="completed", done=len(texts))
    tg.publish_status()
    assert stale_recs["docs"]["model"] == M1 and stale_stats["docs"]["state"] == "running"
    c.update(stale_recs["docs"], stale_stats["docs"])  # ...and applies its result only now
    assert c.model == M2 and c.info()["dimension"] == DIM and c.info()["model"] == M2
    assert c.reembed_status["state"] == "completed"
    tg.abandon(False)
    a.refresh_one("docs")
    assert c.model == M2 and c.record["rev"] == stale_recs["docs"]["rev"] + 1


def test_a_lapsed_claim_cannot_be_renewed_and_a_stale_view_does_not_restart_a_finished_switch(replicas):
    """A holder whose claim lapsed (stalled longer than the TTL) must not take the re-embedding back from the replica
    that took over by renewing with its old place in line; and a replica whose view predates another's switch must
    not start a second re-embedding to the model the collection already has (both seen in a replica test)."""
    loop, a, b = replicas
    ca, texts = _docs(loop, a, 30)
    ta = ca.begin_reembed(M2, DIM, "replica-a")
    assert ta is not None
    ta.lease.stop()  # A stalls: its lease no longer renews the claim (else it would undo the lapse below)
    a.registry.put("l:docs:replica-a", {"owner": "replica-a", "at": ta.claimed_at, "until": 0.0})  # lapsed
    tb = b.get("docs").begin_reembed(M2, DIM, "replica-b")
    assert tb is not None and tb.new == ta.new  # B took over and resumes A's target
    assert ta.renew() is False  # A's old place in line does not win it back
    assert b.registry.holder("docs") == "replica-b"

    stale = dict(b.get("docs").record)  # B's view before its own switch, as another replica would hold it
    rows, _ = tb.pending(None, 100)
    tb.write([r[0] for r in rows], _vectors([r[1] for r in rows], 2))
    assert tb.complete()
    tb.abandon(False)
    ta.abandon(False)
    view = a.view(stale)  # a replica whose view predates the switch (its refresh has not run since)
    assert view.model == M1
    assert view.begin_reembed(M2, DIM, "replica-a") is None  # reads the record: already on M2
    assert view.model == M2 and a.registry.holder("docs") is None
    rec = a.registry.record("docs")
    assert a.physical.count(rec["physical"]) == len(texts) and not rec["reembed"]
