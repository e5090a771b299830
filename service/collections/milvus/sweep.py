"""Dropping physical Milvus collections that no collection uses any more: retired ones (after a re-embedding's
switch, once no replica's view can still use them) and those a crash left behind.

**What counts as left by a crash, and why nothing in flight is removed**: the sweep only ever considers a physical
collection that the registry itself announced (a ``p:<physical>`` row, written by a create, a re-embedding or a
delete before it creates or drops that collection, under a claim: :mod:`.lifecycle`, :mod:`.target`). Such a
collection is dropped only when all of these hold, in the registry's own ordering rather than by clocks:

* the claim named in its ``p:`` row is held by no one (no unexpired claim: its maker finished, failed or died, and
  a live maker renews its claim, :class:`~.registry.Lease`), and the row is older than the claim TTL (a claim
  written just now may not be visible yet);
* no record points at it (as its points or as a re-embedding's target) and no ``r:`` row retires it;
* no Milvus alias points at it (a collection whose alias exists is in use, even if a registry read came back short).

A physical collection the registry never announced (made by another deployment that shares the Milvus, or before
this rule) is never touched.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("service.collections.milvus")


def drop_retired(b: Any) -> None:
    """Drop the retired physical collections whose ``drop_after`` has passed (and their ``r:`` rows)."""
    for physical, doc in b.registry.retired().items():
        if doc["drop_after"] <= time.time():
            b.drop_physical(physical)
            b.registry.remove([f"r:{physical}"])


def sweep(b: Any) -> list[str]:
    """Drop the physical collections a crash left (module docstring); returns those dropped. Any replica may run it
    at any time; two at once drop the same ones (dropping is idempotent)."""
    reg, ttl = b.registry, b.settings.milvus_claim_ttl_s
    stale = {
        p: d for p, d in reg.intents().items() if time.time() - d.get("at", 0) > ttl and not reg.holder(d["claim"])
    }
    if not stale:
        return []
    recs, _ = reg.records()
    used = set(reg.retired())
    for r in recs.values():
        used.add(r["physical"])
        if r.get("reembed"):
            used.add(r["reembed"]["physical"])
    dropped = []
    for physical in stale:
        if physical not in used:
            if b.client.has_collection(physical) and b.client.list_aliases(physical).get("aliases"):
                log.warning("milvus: %s has no registry row but an alias points at it: kept", physical)
                continue
            if not b.drop_physical(physical):
                continue
            log.warning("milvus: dropped %s, left by a create, re-embedding or delete that did not finish", physical)
            dropped.append(physical)
        reg.remove([f"p:{physical}"])
    return dropped
