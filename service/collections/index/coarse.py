"""The coarse quantizer of the inverted-file index types (``ivf_pq``, ``ivf_sq``): ``nlist`` centroids, each vector
stored in the list of its nearest (Jégou, Douze & Schmid, "Product Quantization for Nearest Neighbor Search",
TPAMI 2011, section IV.A).

Construction (:func:`ivf_index`): a flat quantizer owned by the index; searches ask it for their ``nprobe`` lists
(exact). Adding (:func:`add_to_lists`): from :data:`TWO_LEVEL_MIN_NLIST` lists, each vector's list is found in an
HNSW graph over the centroids (FAISS's ``IndexHNSWFlat``, M 32, ``efSearch`` 16; Malkov & Yashunin, arXiv:1603.09320)
instead of by ``nlist`` inner products (:func:`assign`, done before a write takes the collection's write mutex), and
the vectors added with ``faiss.contrib.ivf_tools.add_preassigned``: at 1M vectors and 4,096 lists, 42 s instead of
186 s on one thread, 96.9 % of the vectors in their nearest list (the rest in a near one, which a search probes too),
recall@10 0.966 against 0.965 at nprobe 256 (docs/performance.md). The graph is derived from the centroids (never
saved; built again, in well under a second, after a snapshot is loaded).

Training (:func:`train_coarse`): for many lists, FAISS's two-level k-means
(``faiss.contrib.clustering.two_level_clustering``: ``sqrt(nlist)`` clusters, then each split in proportion to its
size) instead of one k-means over every list: each training vector is compared with about ``2 * sqrt(nlist)``
centroids per iteration instead of ``nlist``. At 1M random-projection vectors, nlist 4096,
200,000 training vectors, one thread (docs/performance.md, "Training an IVF index's lists"): the lists in 27 s
instead of 308 s, recall@10 0.965 against 0.969 at nprobe 256, and better-balanced lists. For the
inner-product metrics (``cosine``, ``dot``) the centroids are spherical (unit norm), as FAISS's own IVF training
makes them: an inner-product search favours long centroids, so plain L2 centroids would fill a few lists (a
list-imbalance factor of 27.8 measured, against 2.9 spherical).
"""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import faiss
import numpy as np
from faiss.contrib.clustering import two_level_clustering
from faiss.contrib.ivf_tools import add_preassigned

from service.collections.index.base import IndexSpec, faiss_metric

log = logging.getLogger("service.collections")

#: from this many lists the coarse quantizer is trained by two-level k-means and writes find their list in a graph
#: (below, one k-means and exact assignment are cheap anyway: nlist 1024 on 64k vectors ~25 s on one core)
TWO_LEVEL_MIN_NLIST = 1024
#: the assignment graph's links per node and search breadth (efSearch 64: 99.4 % in the nearest list, no more recall,
#: 116 s for 1M instead of 42)
GRAPH_M, GRAPH_EF = 32, 16


#: FAISS ``IndexIVF.parallel_mode``: 1 splits one query's probed lists over the search's OpenMP threads (0, FAISS's
#: default, splits queries: a single query then runs on one thread whatever ``collections_faiss_threads`` says)
PARALLEL_MODE = 1
#: a filter admitting the share ``s`` of the vectors probes ``nprobe * s ** -FILTER_NPROBE_EXPONENT`` lists
FILTER_NPROBE_EXPONENT = 0.3


def ivf_index(spec: IndexSpec, make: Callable[[faiss.Index, int], faiss.IndexIVF]) -> faiss.IndexIVF:
    """An empty IVF index ``make(coarse quantizer, metric)`` over a flat coarse quantizer it owns, ``nprobe`` from
    ``spec.params``, ``parallel_mode`` :data:`PARALLEL_MODE` (IVF-PQ and IVF-SQ alike)."""
    metric = faiss_metric(spec.metric)
    quantizer = faiss.IndexFlat(spec.dimension, metric)
    index = make(quantizer, metric)
    index.own_fields = True
    quantizer.this.disown()
    return with_search_settings(spec, index)


def with_search_settings(spec: IndexSpec, index: faiss.IndexIVF) -> faiss.IndexIVF:
    """``index`` with the search settings FAISS does not serialise set: ``nprobe`` from ``spec.params`` and
    ``parallel_mode`` :data:`PARALLEL_MODE` (on a new index, and on one read from a snapshot)."""
    index.nprobe = spec.params["nprobe"]
    index.parallel_mode = PARALLEL_MODE
    return index


def filtered_nprobe(nprobe: int, nlist: int, admitted: float) -> int:
    """The lists a search probes when its filter admits the share ``admitted`` (0-1] of the vectors: ``nprobe``
    (the unfiltered breadth) times ``admitted ** -0.3`` (:data:`FILTER_NPROBE_EXPONENT`), at most ``nlist``.

    A filter leaves ``admitted`` of each probed list's vectors to score, and its nearest admitted points lie
    farther out than the unfiltered nearest, in lists a plain ``nprobe`` does not reach. The exponent is measured,
    not derived: on 10M 384-d vectors, ``ivf_sq`` nlist 16384, recall@10 against exact filtered search at 10 / 1 /
    0.1 % filters was 0.93 / 0.875 / 0.81 at nprobe 512 and 0.955 / 0.965 / 0.975 at 1024 / 2048 / 4096 lists
    (``bench.micro.scale_sweep --snapshot``, docs/performance.md), i.e. twice the lists for each tenfold narrower
    filter kept recall at about the unfiltered 0.975."""
    if not 0 < admitted < 1:
        return min(nprobe, nlist)
    return min(nlist, math.ceil(nprobe * admitted**-FILTER_NPROBE_EXPONENT))


def train_coarse(spec: IndexSpec, index: faiss.IndexIVF, sample: np.ndarray) -> bool:
    """Train the coarse quantizer of ``index`` (empty, from :func:`ivf_index`) on ``sample`` (float32 ``(s, d)``) by
    two-level k-means when it has at least :data:`TWO_LEVEL_MIN_NLIST` lists; ``index.train`` then trains only what
    is left (the codes' ranges, the PQ codebooks). Returns whether it did; False leaves the quantizer untrained for
    FAISS's own k-means in ``index.train`` (also when two-level k-means fails on the sample, e.g. a first-level
    cluster too small for any centroid of its own: logged)."""
    nlist = int(index.nlist)
    if nlist < TWO_LEVEL_MIN_NLIST:
        return False
    x = np.ascontiguousarray(sample, dtype=np.float32)
    spherical = faiss_metric(spec.metric) == faiss.METRIC_INNER_PRODUCT
    try:
        # min_points_per_centroid 1: FAISS's warning below 39 vectors a centroid is printed (to stderr, once per
        # second-level cluster) whenever a cluster's share of the sample is a little under; min_train_points is
        # this index's own floor
        kw = {"spherical": spherical, "min_points_per_centroid": 1}
        centroids, _ = two_level_clustering(x, int(np.sqrt(nlist)), nlist, **kw)
    except RuntimeError as e:
        log.warning("two-level k-means of %d lists on %d vectors failed (%s): one k-means instead", nlist, len(x), e)
        return False
    index.quantizer.add(np.ascontiguousarray(centroids, dtype=np.float32))
    return True


_graphs: weakref.WeakKeyDictionary[faiss.IndexIVF, faiss.IndexHNSWFlat] = weakref.WeakKeyDictionary()
_graphs_lock = threading.Lock()


def assignment_graph(index: faiss.IndexIVF) -> faiss.IndexHNSWFlat:
    """The HNSW graph over the trained ``index``'s centroids (its metric), built on first use and kept while the
    index's Python object lives (a snapshot loaded is a new object: it builds its own)."""
    with _graphs_lock:
        graph = _graphs.get(index)
    if graph is None:
        graph = faiss.IndexHNSWFlat(index.d, GRAPH_M, index.metric_type)
        graph.add(index.quantizer.reconstruct_n(0, index.nlist))
        graph.hnsw.efSearch = GRAPH_EF
        with _graphs_lock:
            graph = _graphs.setdefault(index, graph)
    return graph


@dataclass(frozen=True)
class Assignment:
    """Each vector's list as :func:`assign` found it in ``index``'s graph: valid for that index object only (a trained
    index's centroids never change; one trained or loaded again is another object)."""

    index: faiss.IndexIVF
    #: int64 ``(n,)``: the list of each vector, in the order given
    lists: np.ndarray


def assign(index: faiss.IndexIVF, vectors: np.ndarray) -> Assignment | None:
    """The lists that :func:`add_to_lists` would put ``vectors`` (float32 ``(n, d)``, contiguous) in, found without
    changing ``index`` (its centroids and graph are only read): a write computes it before taking the collection's
    write mutex, so that concurrent writes search the graph side by side. None below :data:`TWO_LEVEL_MIN_NLIST`
    lists (FAISS assigns exactly as it adds)."""
    if index.nlist < TWO_LEVEL_MIN_NLIST or len(vectors) == 0:
        return None
    lists = np.ascontiguousarray(assignment_graph(index).search(vectors, 1)[1].ravel())
    if (missed := lists < 0).any():  # none found (FAISS's IVF would skip the vector): the exact list
        lists[missed] = index.quantizer.assign(vectors[missed], 1).ravel()
    return Assignment(index, lists)


def add_through_graph(index: faiss.IndexIVF, vectors: np.ndarray, ids: np.ndarray) -> None:
    """Add ``vectors`` (float32 ``(n, d)``, contiguous) under ``ids`` (int64 ``(n,)``) to the trained ``index`` through
    FAISS's own ``add_with_ids``, each vector's list found in :func:`assignment_graph` (from
    :data:`TWO_LEVEL_MIN_NLIST` lists) by giving the index that graph as its quantizer for the call: for an index whose
    lists hold codes in blocks (FAISS's fast-scan ``IndexIVFPQFastScan``), which only its own ``add_with_ids`` packs
    (``add_preassigned`` writes unpacked codes into the blocks). The graph holds the same centroids in the same order,
    so a vector's residual is the same. Searches must not run meanwhile (the caller holds the collection's write
    lock); searches then use the exact flat quantizer again."""
    if index.nlist < TWO_LEVEL_MIN_NLIST or len(vectors) == 0:
        index.add_with_ids(vectors, ids)
        return
    flat = index.quantizer
    index.quantizer = assignment_graph(index)
    try:
        index.add_with_ids(vectors, ids)
    finally:
        index.quantizer = flat


def add_to_lists(
    index: faiss.IndexIVF, vectors: np.ndarray, ids: np.ndarray, assigned: Assignment | None = None
) -> None:
    """Add ``vectors`` (float32 ``(n, d)``, contiguous) under ``ids`` (int64 ``(n,)``) to the trained ``index``, each
    into the list :func:`assignment_graph` finds (from :data:`TWO_LEVEL_MIN_NLIST` lists; below, FAISS's exact
    assignment, ``add_with_ids``). ``assigned``: :func:`assign`'s result for these vectors, used when it was made
    for this ``index`` (else found again here)."""
    if index.nlist < TWO_LEVEL_MIN_NLIST or len(vectors) == 0:
        index.add_with_ids(vectors, ids)
        return
    if assigned is None or assigned.index is not index or len(assigned.lists) != len(vectors):
        assigned = assign(index, vectors)
    add_preassigned(index, vectors, assigned.lists, ids)
