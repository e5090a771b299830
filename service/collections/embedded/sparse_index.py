"""The in-memory inverted index of one sparse vector of an embedded collection: derived data, built at open from the
durable ``sparse_vectors`` table (:func:`.store.named.iter_sparse`) and kept up to date by each write, like the FAISS
index of a dense vector.

Layout (measured against the alternatives in docs/performance.md, "Sparse inverted index"): each point holding the
vector gets a *slot* (int32, in internal-id order: internal ids only grow, so ``slot -> iid`` is an ascending array);
postings live in immutable *segments*, each a CSC-like block ``terms`` (uint32, ascending) / ``indptr`` / ``slots``
(int32, ascending within a term) / ``vals`` (float32). A write appends a segment made from its points and merges it
into the previous one while that one is no larger (a binary-counter merge policy, the idea of Lucene's
``LogMergePolicy``: O(log n) segments, each posting merged O(log n) times); a build ends with one segment. A removed
point's slot is marked dead (a tombstone) and its terms' document frequencies go down at once; when dead postings pass
:data:`COMPACT_FRACTION` of all, every segment is rewritten without them and the slots are renumbered.

Scoring (exact, what the SQL inverted index used to compute): the dot product of the query with each point sharing a
term with it, in float64 summed term by term in ascending term order, each query weight multiplied by the term's IDF
(:func:`~...schema.idf` over the live points holding the vector, document frequencies counted from the live postings)
when the modifier is ``idf``; returned as float32. A set of allowed points narrows the postings read (a binary search
of the allowed slots in each posting list when the set is small, a boolean mask otherwise).

Concurrency: a write builds a new :class:`_State` and publishes it with one assignment (copy-on-write: segments are
never changed, the tombstone array is copied before it is changed, slot arrays only grow past the published length),
so a search reading the published state never sees a half-applied write; writes themselves are serialised by the
caller (the collection's write mutex). A write that merges large segments takes time in proportion to them (about
half a second for 40M postings), once per doubling.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from service.collections.arrays import sorted_unique
from service.collections.schema import SparseVec, idf

#: a new segment is merged into the previous one while that one holds at most this many times its postings
MERGE_RATIO = 1
#: dead postings past this fraction of all postings (and past :data:`COMPACT_MIN`) trigger a compaction
COMPACT_FRACTION = 0.25
COMPACT_MIN = 4096
#: a posting list at least this many times longer than the allowed slots is binary-searched for them (else masked)
SEARCH_RATIO = 8

Packed = tuple[np.ndarray, np.ndarray, np.ndarray]  # lengths int64 (n,), terms uint32 (p,), vals float32 (p,)


def pack(vecs: list[SparseVec]) -> Packed:
    """``(lengths, terms, vals)``: sparse vectors as one posting run (each vector's entries, vector after vector)."""
    lengths = np.fromiter((len(v.indices) for v in vecs), np.int64, count=len(vecs))
    if not len(vecs):
        return lengths, np.empty(0, np.uint32), np.empty(0, np.float32)
    terms = np.concatenate([np.asarray(v.indices, np.uint32) for v in vecs])
    vals = np.concatenate([np.asarray(v.values, np.float32) for v in vecs])
    return lengths, terms, vals


@dataclass(frozen=True)
class Segment:
    """An immutable block of postings: ``terms`` uint32 ``(t,)`` ascending, ``indptr`` int64 ``(t + 1,)``, and per
    posting ``slots`` int32 ``(p,)`` (ascending within a term) and ``vals`` float32 ``(p,)``; ``sid`` names it (a
    snapshot writes each segment once, under its name: :mod:`.sparse_snapshots`)."""

    terms: np.ndarray
    indptr: np.ndarray
    slots: np.ndarray
    vals: np.ndarray
    sid: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)

    @classmethod
    def of(cls, terms: np.ndarray, slots: np.ndarray, vals: np.ndarray) -> Segment:
        """The segment of postings given one per entry, ordered by slot within each term (the stable sort by term
        keeps that order; runs already sorted by term, as merged segments are, cost one linear merge each)."""
        order = np.argsort(terms, kind="stable")
        t = terms[order]
        starts = np.flatnonzero(t[1:] != t[:-1]) + 1 if len(t) else np.empty(0, np.int64)
        first = np.concatenate([[0], starts]).astype(np.int64) if len(t) else starts
        indptr = np.concatenate([first, [len(t)]]).astype(np.int64)
        return cls(t[first], indptr, slots[order].astype(np.int32), vals[order].astype(np.float32))

    @property
    def nnz(self) -> int:
        """How many postings it holds."""
        return len(self.slots)

    def expanded(self) -> np.ndarray:
        """The term of each posting, uint32 ``(p,)``."""
        return np.repeat(self.terms, np.diff(self.indptr))

    def lookup(self, qterms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` int64 ``(q,)`` of the posting lists of ``qterms`` (empty where absent)."""
        pos = np.searchsorted(self.terms, qterms)
        hit = pos < len(self.terms)
        hit[hit] = self.terms[pos[hit]] == qterms[hit]
        starts = np.where(hit, self.indptr[np.minimum(pos, len(self.terms))], 0)
        ends = np.where(hit, self.indptr[np.minimum(pos + 1, len(self.terms))], 0)
        return starts, ends


def merged(segments: list[Segment], remap: np.ndarray | None = None) -> Segment:
    """One segment holding the postings of ``segments`` (given in slot order); ``remap``: int64 new slot of each old
    slot, -1 for a dead one (its postings are dropped)."""
    terms = np.concatenate([s.expanded() for s in segments])
    slots = np.concatenate([s.slots for s in segments])
    vals = np.concatenate([s.vals for s in segments])
    if remap is not None:
        new = remap[slots]
        keep = new >= 0
        terms, slots, vals = terms[keep], new[keep], vals[keep]
    return Segment.of(terms, slots, vals)


@dataclass(frozen=True)
class _State:
    """One published version of the index. ``slot_iid`` (int64) and ``dead`` (bool) are buffers valid up to ``n``;
    ``dead_terms`` (uint32, ascending) / ``dead_counts`` (int64): the dead postings of each term still stored."""

    segments: tuple[Segment, ...] = ()
    slot_iid: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    dead: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    n: int = 0
    live: int = 0
    dead_terms: np.ndarray = field(default_factory=lambda: np.empty(0, np.uint32))
    dead_counts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    dead_postings: int = 0

    @property
    def postings(self) -> int:
        """Postings stored, dead ones included."""
        return sum(s.nnz for s in self.segments)


def _grown(buf: np.ndarray, need: int) -> np.ndarray:
    """``buf`` itself if it holds ``need`` items, else a copy with room to spare (doubling)."""
    if len(buf) >= need:
        return buf
    out = np.zeros(max(need, 2 * len(buf), 1024), buf.dtype)
    out[: len(buf)] = buf
    return out


class SparseIndex:
    """The inverted index of one sparse vector (see the module docstring). Empty when made; :meth:`build` loads one."""

    def __init__(self) -> None:
        self._state = _State()

    @classmethod
    def build(cls, chunks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> SparseIndex:
        """The index of the stored vectors given as ``(iids, lengths, terms, vals)`` chunks (int64 ``(c,)`` ascending
        across chunks, int64 ``(c,)``, uint32 and float32 ``(sum(lengths),)``; :func:`.store.named.iter_sparse`)."""
        out = cls()
        for iids, lengths, terms, vals in chunks:
            out.add(iids, (lengths, terms, vals))
        st = out._state
        if len(st.segments) > 1:
            out._state = replace(st, segments=(merged(list(st.segments)),))
        return out

    def saved(self) -> tuple[tuple[Segment, ...], dict[str, np.ndarray]]:
        """``(segments, arrays)``: what a snapshot keeps (:mod:`.sparse_snapshots`) besides the segments: the slot
        table and tombstones up to ``n``, the dead postings per term and the counters (int64 scalars)."""
        st = self._state
        arrays = {"slot_iid": st.slot_iid[: st.n], "dead": st.dead[: st.n], "dead_terms": st.dead_terms}
        arrays |= {
            "dead_counts": st.dead_counts,
            "live": np.int64(st.live),
            "dead_postings": np.int64(st.dead_postings),
        }
        return st.segments, arrays

    @classmethod
    def restored(cls, segments: list[Segment], arrays: dict[str, np.ndarray]) -> SparseIndex:
        """The index :meth:`saved` described (checked for consistency).

        Raises:
            ValueError: the parts do not fit together (a slot or count out of range, ids not ascending).
        """
        slot_iid, dead = np.asarray(arrays["slot_iid"], np.int64), np.asarray(arrays["dead"], bool)
        n, live, dead_postings = len(slot_iid), int(arrays["live"]), int(arrays["dead_postings"])
        dead_terms, dead_counts = np.asarray(arrays["dead_terms"], np.uint32), np.asarray(arrays["dead_counts"])
        ok = len(dead) == n and live == n - int(dead.sum()) and bool(np.all(np.diff(slot_iid) > 0))
        ok = ok and len(dead_terms) == len(dead_counts) and int(dead_counts.sum()) == dead_postings
        for s in segments:
            ok = ok and len(s.indptr) == len(s.terms) + 1 and int(s.indptr[-1]) == s.nnz == len(s.vals)
            ok = ok and (not s.nnz or (int(s.slots.min()) >= 0 and int(s.slots.max()) < n))
        if not ok:
            raise ValueError("the saved sparse index is inconsistent")
        out = cls()
        out._state = _State(
            tuple(segments), slot_iid, dead, n, live, dead_terms, dead_counts.astype(np.int64), dead_postings
        )
        return out

    # --- reading -------------------------------------------------------------------------------------------------
    @property
    def live(self) -> int:
        """How many points hold the vector."""
        return self._state.live

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (postings, slot table, tombstones)."""
        st = self._state
        seg = sum(s.terms.nbytes + s.indptr.nbytes + s.slots.nbytes + s.vals.nbytes for s in st.segments)
        return seg + st.slot_iid.nbytes + st.dead.nbytes + st.dead_terms.nbytes + st.dead_counts.nbytes

    def holders(self) -> np.ndarray:
        """The internal ids (int64, ascending) of the points holding the vector."""
        st = self._state
        return st.slot_iid[: st.n][~st.dead[: st.n]]

    def scores(
        self, query: SparseVec, modifier: str, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The exact dot product of ``query`` with every live point sharing a term with it (among ``allowed``: int64
        internal ids; None: all), IDF-weighted when ``modifier`` is ``idf`` (see the module docstring).

        Returns:
            ``(iids, scores)``: int64 (ascending) and float32 ``(m,)``.
        """
        st = self._state
        slots, sc = _score(st, query, modifier, None if allowed is None else _allowed_slots(st, allowed))
        return st.slot_iid[slots], sc

    def search(
        self, query: SparseVec, modifier: str, top_k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``top_k`` best of :meth:`scores`: ``(scores, iids)``, best first, ties by internal id (every point
        tied with the k-th is considered, so the cut is by internal id too)."""
        iids, sc = self.scores(query, modifier, allowed)
        if len(sc) > top_k > 0:
            part = np.argpartition(-sc, top_k - 1)
            keep = sc >= sc[part[top_k - 1]]
            iids, sc = iids[keep], sc[keep]
        order = np.lexsort((iids, -sc))[:top_k]
        return sc[order], iids[order]

    # --- writing (serialised by the caller) -------------------------------------------------------------------------
    def add(self, iids: np.ndarray, packed: Packed) -> None:
        """Index the vectors ``packed`` (:func:`pack`) of the new points ``iids`` (int64, each larger than every
        internal id indexed before: internal ids only grow)."""
        lengths, terms, vals = packed
        if not len(iids):
            return
        st = self._state
        m = len(iids)
        slot_iid = _grown(st.slot_iid, st.n + m)
        slot_iid[st.n : st.n + m] = iids  # past the published length: no reader looks there
        dead = _grown(st.dead, st.n + m)
        slots = np.repeat(np.arange(st.n, st.n + m, dtype=np.int32), lengths)
        segs = list(st.segments)
        if len(slots):
            segs.append(Segment.of(np.asarray(terms, np.uint32), slots, np.asarray(vals, np.float32)))
        while len(segs) > 1 and segs[-2].nnz <= MERGE_RATIO * segs[-1].nnz:
            segs[-2:] = [merged(segs[-2:])]
        self._state = replace(st, segments=tuple(segs), slot_iid=slot_iid, dead=dead, n=st.n + m, live=st.live + m)

    def remove(self, iids: np.ndarray, terms: np.ndarray | None = None) -> None:
        """Drop the points ``iids`` (int64; those not indexed are ignored). ``terms``: the indices of their vectors,
        concatenated (what the store deleted, :class:`.store.named.Removed`), which lower the document frequencies;
        None: found from the postings (a scan of every segment)."""
        st = self._state
        slot_iid = st.slot_iid[: st.n]
        iids = np.asarray(iids, np.int64)
        pos = np.searchsorted(slot_iid, iids)
        found = pos < st.n
        found[found] = slot_iid[pos[found]] == iids[found]
        slots = sorted_unique(pos[found])
        slots = slots[~st.dead[slots]]
        if not len(slots):
            return
        if terms is None:
            gone = np.zeros(st.n, bool)
            gone[slots] = True
            terms = np.concatenate([s.expanded()[gone[s.slots]] for s in st.segments])
        dead = st.dead.copy()  # readers of the published state keep theirs
        dead[slots] = True
        allt = np.concatenate([st.dead_terms, np.asarray(terms, np.uint32)])
        allc = np.concatenate([st.dead_counts, np.ones(len(terms), np.int64)])
        u, inv = np.unique(allt, return_inverse=True)
        c = np.bincount(inv, weights=allc, minlength=len(u)).astype(np.int64)
        st = replace(
            st,
            dead=dead,
            live=st.live - len(slots),
            dead_terms=u,
            dead_counts=c,
            dead_postings=st.dead_postings + len(terms),
        )
        if st.dead_postings > max(COMPACT_MIN, COMPACT_FRACTION * st.postings):
            st = _compacted(st)
        self._state = st


def _compacted(st: _State) -> _State:
    """``st`` with its dead postings dropped and its live slots renumbered (in the same order)."""
    alive = ~st.dead[: st.n]
    remap = np.where(alive, np.cumsum(alive) - 1, -1).astype(np.int64)
    segs = (merged(list(st.segments), remap),) if st.segments else ()
    iids = st.slot_iid[: st.n][alive]
    return _State(segs, iids.copy(), np.zeros(len(iids), bool), len(iids), len(iids))


def _allowed_slots(st: _State, allowed: np.ndarray) -> np.ndarray:
    """The live slots (int64, ascending, unique) of the internal ids ``allowed`` that hold the vector."""
    allowed = np.asarray(allowed, np.int64)
    pos = np.searchsorted(st.slot_iid[: st.n], allowed)
    found = pos < st.n
    found[found] = st.slot_iid[pos[found]] == allowed[found]
    slots = sorted_unique(pos[found])
    return slots[~st.dead[slots]]


def _weights(st: _State, query: SparseVec, modifier: str) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
    """``(terms, weights, lists)``: the query's terms held by some live point (ascending), their float64 weights
    (IDF-multiplied for ``idf``), and per term its posting lists ``[(segment, start, end), ...]``."""
    qt = np.asarray(query.indices, np.uint32)
    qv = np.asarray(query.values, np.float32).astype(np.float64)
    order = np.argsort(qt, kind="stable")
    qt, qv = qt[order], qv[order]
    spans = [s.lookup(qt) for s in st.segments]
    df = sum((e - b for b, e in spans), np.zeros(len(qt), np.int64))
    if len(st.dead_terms):
        pos = np.minimum(np.searchsorted(st.dead_terms, qt), len(st.dead_terms) - 1)
        df = df - np.where(st.dead_terms[pos] == qt, st.dead_counts[pos], 0)
    held = df > 0
    w = qv[held]
    if modifier == "idf":
        w = w * idf(st.live, df[held]).astype(np.float64)
    lists = [
        [(s, int(b[j]), int(e[j])) for s, (b, e) in zip(st.segments, spans) if e[j] > b[j]]
        for j in np.flatnonzero(held)
    ]
    return qt[held], w, lists


def _score(st: _State, query: SparseVec, modifier: str, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, scores)`` (int64 ascending, float32) of the live points sharing a term with ``query`` among the
    ``allowed`` slots (None: all)."""
    _, w, lists = _weights(st, query, modifier)
    mask = None
    parts: list[tuple[np.ndarray, np.ndarray, float]] = []  # (slots, values, weight), term after term
    for wt, spans in zip(w.tolist(), lists):
        for seg, b, e in spans:
            sl, vs = seg.slots[b:e], seg.vals[b:e]
            if allowed is not None:
                if len(allowed) * SEARCH_RATIO <= e - b:
                    i = np.minimum(np.searchsorted(sl, allowed), e - b - 1)
                    hit = sl[i] == allowed
                    sl, vs = allowed[hit], vs[i[hit]]
                else:
                    if mask is None:
                        mask = np.zeros(st.n, bool)
                        mask[allowed] = True
                    keep = mask[sl]
                    sl, vs = sl[keep], vs[keep]
            if len(sl):
                parts.append((sl, vs, wt))
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    every = np.concatenate([p[0] for p in parts])
    weights = np.repeat([p[2] for p in parts], [len(p[0]) for p in parts])
    contrib = np.concatenate([p[1] for p in parts]).astype(np.float64) * weights  # summed in this order: by term
    if len(every) * 4 < st.n:  # few postings: by sorting them
        slots, inv = np.unique(every, return_inverse=True)
        acc = np.bincount(inv, weights=contrib, minlength=len(slots))
    else:  # many: over every slot
        slots = np.flatnonzero(np.bincount(every, minlength=st.n))
        acc = np.bincount(every, weights=contrib, minlength=st.n)[slots]
    slots = slots.astype(np.int64)
    if allowed is None:  # the allowed slots are live already
        live = ~st.dead[slots]
        slots, acc = slots[live], acc[live]
    return slots, acc.astype(np.float32)
