"""The size claims of a serialized FAISS index, checked before FAISS reads it.

FAISS's reader (``faiss/impl/index_read.cpp``) allocates what each count in the file claims before reading the items
(``READVECTOR``: up to 2^40 items), so a snapshot of a few KB could make it allocate gigabytes. :func:`check_claims`
walks the structures this service writes (``IndexIDMap2`` over ``IndexFlat``, ``IndexScalarQuantizer``,
``IndexHNSWFlat`` or ``IndexHNSWSQ``; ``IndexIVFPQ`` and ``IndexIVFScalarQuantizer`` with a flat quantizer and array
inverted lists; ``IndexIVFPQFastScan`` with a flat quantizer and block inverted lists) and checks every count against the bytes left; any other structure
is :class:`UnknownIndexFormat` (left unchecked: the caller does not give it to FAISS).
"""

from __future__ import annotations

import struct
from typing import Any

#: the largest IVF list count and PQ bits a snapshot may claim (a create's range: .ivf_pq)
_MAX_NLIST, _MAX_NBITS = 65536, 12


class UnknownIndexFormat(ValueError):
    """A serialized FAISS index of a structure :func:`check_claims` does not read (its size claims unchecked)."""


class _Claims:
    """A walk over a serialized FAISS index (FAISS's ``impl/index_read.cpp`` format, 1.7-1.15): every count it
    claims is checked against the bytes left before the walk skips them, and every dimension against the
    collection's."""

    def __init__(self, buf: Any, dimension: int, start: int) -> None:
        self.buf, self.at, self.d = buf, start, dimension

    def left(self) -> int:
        return len(self.buf) - self.at

    def skip(self, n: int, what: str) -> None:
        if n < 0 or n > self.left():
            raise ValueError(f"the FAISS index claims {n} bytes of {what}; {self.left()} are left in the file")
        self.at += n

    def read(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if size > self.left():
            raise ValueError("the FAISS index is truncated")
        (v,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return v

    def vector(self, item: int, what: str) -> int:
        """Skip a ``std::vector`` (a uint64 count, then its items of ``item`` bytes); its count."""
        n = self.read("<Q")
        if n > self.left() // item:
            raise ValueError(f"the FAISS index claims {n} {what}; {self.left()} bytes are left in the file")
        self.skip(n * item, what)
        return n

    def header(self) -> int:
        """An index's common header (``read_index_header``); its ``ntotal``, checked against the bytes left."""
        d, ntotal = self.read("<i"), self.read("<q")
        self.skip(16, "header")  # two unused int64
        self.read("<B")  # is_trained
        if self.read("<i") > 1:  # metric_type: a metric with an argument
            self.skip(4, "header")
        if d != self.d:
            raise ValueError(f"the FAISS index claims dimension {d}; the collection's is {self.d}")
        if not 0 <= ntotal <= self.left():
            raise ValueError(f"the FAISS index claims {ntotal} vectors; {self.left()} bytes are left in the file")
        return ntotal

    def index(self) -> int:
        """One index, nested ones included; its ``ntotal``."""
        fourcc = bytes(self.buf[self.at : self.at + 4])
        self.skip(4, "fourcc")
        if fourcc in (b"IxM2", b"IxMp"):  # IndexIDMap(2): header, the index, its ids
            n = self.header()
            if self.index() != n or self.vector(8, "ids") != n:
                raise ValueError(f"the FAISS id map holds other than its {n} vectors")
        elif fourcc in (b"IxFI", b"IxF2", b"IxFl"):  # IndexFlat: header, the vectors
            n = self.header()
            if self.vector(4, "floats") != n * self.d:
                raise ValueError(f"the FAISS flat index holds other than its {n} vectors")
        elif fourcc == b"IxSQ":  # IndexScalarQuantizer: header, the quantizer, the codes
            n = self.header()
            code_size = self.scalar_quantizer()
            if self.vector(1, "codes") != n * code_size:
                raise ValueError(f"the FAISS scalar-quantized index holds other than its {n} codes")
        elif fourcc in (b"IHNf", b"IHNs"):  # IndexHNSWFlat / IndexHNSWSQ: header, the graph, the storage
            n = self.header()
            for item, what in ((8, "level probabilities"), (4, "level sizes"), (4, "levels"), (8, "offsets")):
                self.vector(item, what)
            self.vector(4, "neighbours")
            self.skip(20, "graph parameters")  # entry_point, max_level, efConstruction, efSearch, upper_beam
            if self.index() != n:
                raise ValueError(f"the FAISS graph's storage holds other than its {n} vectors")
        elif fourcc == b"IwSq":  # IndexIVFScalarQuantizer: IVF header, the quantizer, code size, lists
            n, nlist = self.ivf_header()
            code_size = self.scalar_quantizer()
            if self.read("<Q") != code_size:
                raise ValueError("the FAISS IVF index's code size is not its quantizer's")
            self.read("<B")  # by_residual
            if self.lists(nlist, code_size) != n:
                raise ValueError(f"the FAISS inverted lists hold other than their {n} vectors")
        elif fourcc == b"IwPQ":  # IndexIVFPQ: IVF header, by_residual, product quantizer, lists
            n, nlist = self.ivf_header()
            self.read("<B")  # by_residual
            code_size = self.read("<Q")
            if code_size > self.product_quantizer(_MAX_NBITS) * 2:
                raise ValueError(f"the FAISS IVF-PQ index claims codes of {code_size} bytes")
            if self.lists(nlist, code_size) != n:
                raise ValueError(f"the FAISS inverted lists hold other than their {n} vectors")
        elif fourcc == b"IwPf":  # IndexIVFPQFastScan: IVF header, fast-scan fields, product quantizer, block lists
            n, nlist = self.ivf_header()
            self.read("<B")  # by_residual
            self.read("<Q")  # code_size
            bbs, m2 = self.read("<i"), self.read("<Q")
            self.read("<i")  # implem
            self.read("<Q")  # qbs2
            m = self.product_quantizer()
            if not (bbs > 0 and bbs % 32 == 0 and m2 in (m, m + 1) and m2 % 2 == 0):
                raise ValueError(f"the FAISS fast-scan index claims blocks of {bbs}, M2={m2} for M={m}")
            if self.blocks(nlist, bbs, bbs * m2 // 2) != n:
                raise ValueError(f"the FAISS inverted lists hold other than their {n} vectors")
        else:
            raise UnknownIndexFormat(f"a FAISS index of type {fourcc!r}")
        return n

    def ivf_header(self) -> tuple[int, int]:
        """``write_ivf_header``: the index header, ``nlist``, ``nprobe``, the coarse quantizer (one centroid a
        list) and the direct map; ``(ntotal, nlist)``."""
        n = self.header()
        nlist = self.read("<Q")
        self.read("<Q")  # nprobe
        if not 1 <= nlist <= _MAX_NLIST or self.index() != nlist:  # the quantizer holds one centroid a list
            raise ValueError(f"the FAISS index claims {nlist} lists")
        if self.read("<B") == 2:  # a direct map: its array, or its hash table
            self.vector(16, "direct map entries")
        else:
            self.vector(8, "direct map entries")
        return n, nlist

    def product_quantizer(self, max_nbits: int = 4) -> int:
        """``write_ProductQuantizer``: dimension, sub-quantizers ``M`` and bits (at most ``max_nbits``: fast scan's
        4), then ``d * 2**nbits`` centroid floats; its ``M``."""
        d, m, nbits = self.read("<Q"), self.read("<Q"), self.read("<Q")
        if d != self.d or not (1 <= m <= d and d % m == 0 and 1 <= nbits <= max_nbits):
            raise ValueError(f"the FAISS product quantizer claims d={d}, M={m}, nbits={nbits}")
        if self.vector(4, "centroids") != d << nbits:
            raise ValueError("the FAISS product quantizer holds other than its centroids")
        return m

    def blocks(self, nlist: int, n_per_block: int, block_size: int) -> int:
        """``BlockInvertedListsIOHook::write``: ``nlist`` lists, each its int64 ids then its codes packed in blocks of
        ``n_per_block`` vectors of ``block_size`` bytes (as the index's fields say); their total size."""
        fourcc = bytes(self.buf[self.at : self.at + 4])
        self.skip(4, "fourcc")
        if fourcc != b"ilbl":
            raise UnknownIndexFormat(f"FAISS fast-scan inverted lists of type {fourcc!r}")
        if self.read("<Q") != nlist:
            raise ValueError("the FAISS block inverted lists are not one per list")
        self.read("<Q")  # code_size (unused by blocks)
        if self.read("<Q") != n_per_block or self.read("<Q") != block_size:
            raise ValueError("the FAISS block inverted lists' blocks are not the index's")
        total = 0
        for _ in range(nlist):
            n = self.vector(8, "ids")
            if self.vector(1, "codes") != -(-n // n_per_block) * block_size:
                raise ValueError(f"a FAISS block inverted list holds other than the blocks of its {n} ids")
            total += n
        return total

    def scalar_quantizer(self) -> int:
        """``write_ScalarQuantizer``: its type, range statistic and argument, dimension, code size and trained
        ranges (at most two floats a dimension); its code size (at most 4 bytes a dimension)."""
        self.read("<i")  # qtype
        self.read("<i")  # rangestat
        self.read("<f")  # rangestat_arg
        d, code_size = self.read("<Q"), self.read("<Q")
        if d != self.d or not 1 <= code_size <= 4 * d:
            raise ValueError(f"the FAISS scalar quantizer claims d={d}, code size {code_size}")
        if self.vector(4, "trained ranges") > 2 * d:
            raise ValueError("the FAISS scalar quantizer claims more ranges than two a dimension")
        return code_size

    def lists(self, nlist: int, code_size: int) -> int:
        """``read_InvertedLists``: an array of ``nlist`` lists of ``code_size``-byte codes and int64 ids; their
        total size."""
        fourcc = bytes(self.buf[self.at : self.at + 4])
        self.skip(4, "fourcc")
        if fourcc == b"il00":
            return 0
        if fourcc != b"ilar" or self.read("<Q") != nlist or self.read("<Q") != code_size:
            raise UnknownIndexFormat(f"FAISS inverted lists of type {fourcc!r}")
        kind, start = bytes(self.buf[self.at : self.at + 4]), self.at + 12
        self.skip(4, "fourcc")
        if kind == b"full":
            if self.vector(8, "list sizes") != nlist:
                raise ValueError("the FAISS inverted lists' sizes are not one per list")
            sizes = struct.unpack_from(f"<{nlist}Q", self.buf, start)
        elif kind == b"sprs":  # (list, size) pairs of the lists not empty
            sizes = struct.unpack_from(f"<{self.vector(8, 'list sizes')}Q", self.buf, start)[1::2]
        else:
            raise UnknownIndexFormat(f"FAISS list sizes of type {kind!r}")
        for n in sizes:
            if n > self.left() // (code_size + 8):
                raise ValueError(f"a FAISS inverted list claims {n} entries; {self.left()} bytes are left in the file")
            self.skip(n * (code_size + 8), "inverted list")
        return sum(sizes)


def check_claims(buf: Any, dimension: int, start: int = 0) -> None:
    """Check a serialized FAISS index (``buf[start:]``; ``buf`` bytes or an mmap) before FAISS reads it: every vector
    count, list count and size it claims fits the bytes the file holds, every dimension is ``dimension``, and the
    walk ends at the file's end. FAISS's reader allocates what a count claims before reading it (up to 2^40 items
    each), so a few KB could otherwise claim gigabytes.

    Raises:
        UnknownIndexFormat: an index (or inverted lists) of a structure not read here: unchecked.
        ValueError: a claim the file cannot hold, another dimension, or bytes past the end of the index.
    """
    walk = _Claims(buf, dimension, start)
    walk.index()
    if walk.left():
        raise ValueError(f"{walk.left()} bytes follow the FAISS index")
