"""The Milvus connection of the milvus backend: every call bounded in time, outages detected once and answered fast.

* :class:`BoundedClient` wraps pymilvus's ``MilvusClient`` and gives every RPC ``timeout=`` whole seconds
  (``collections_milvus_write_timeout_s`` rounded up): pymilvus's retry loop honours only an ``int`` timeout
  (``pymilvus.decorators.retry_on_rpc_failure``); with a float or none it retries an unreachable server 75 times with
  back-off, about 3.5 minutes, which is how a Milvus outage used to hang requests and shutdown.
* :func:`classify` sorts pymilvus's exceptions into *unavailable* (connection refused, deadline exceeded, retries run
  out), *not loaded* (code 101: a collection's segments are loading, e.g. for ~20 s after a Milvus restart) and
  the rest (a genuine error of the request or of this service).
* :class:`Breaker`: once a call found Milvus unavailable — its own error says so, or it was slow (past
  :data:`SUSPECT_S`) and a fresh connection got no answer either — every call fails at once (503
  ``backend_unavailable`` with ``Retry-After``), the ones already waiting included, until a probe on a *fresh*
  connection succeeds. A slow answer alone never opens it: a busy Milvus is not a dead one.
* While the breaker is open the service keeps no connection to Milvus (:meth:`BoundedClient.release`): a gRPC
  channel left open keeps its *subchannel* in gRPC's global subchannel pool, which every new channel to the same
  address with the same options (pymilvus fixes them) shares, reconnect back-off included (1.6x from 1 s, up to
  120 s). With the old connection open across a 150 s outage, a fresh connection reached the restarted Milvus 10-12 s
  after another process did (up to 2 minutes after a longer outage); with it closed, in 0.2 s
  (``bench/milvus_reconnect.py``).
"""

from __future__ import annotations

import base64
import math
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import grpc
from pymilvus import MilvusClient, MilvusException
from pymilvus.grpc_gen import milvus_pb2, milvus_pb2_grpc

from ..errors import BackendUnavailable

#: MilvusClient methods that run locally (no RPC, no timeout argument)
_LOCAL = frozenset({"prepare_index_params", "create_schema", "close"})
NOT_LOADED = (101, 103)  # Milvus's "collection not loaded", "collection not fully loaded"
LOAD_TIMEOUT_S = 60  # creating or loading a collection (not on a request's path): Milvus may take seconds
SUSPECT_S = 1.0  # a request-path call this slow starts a reachability check (Breaker.suspect)
REACH_TIMEOUT_S = 3.0  # that check's connection and call


def long_call(fn: Any) -> Any:
    """Mark a function that makes several Milvus calls or waits on purpose (creating, deleting, re-embedding, claim
    settling): :meth:`~.backend.MilvusBackend.run` does not cut it at one call's timeout."""
    fn.long_call = True
    return fn


def connect(uri: str, token: str | None, timeout_s: float) -> MilvusClient:
    """A new ``MilvusClient`` (its own gRPC channel), connected within ``timeout_s``.

    Raises:
        pymilvus.MilvusException: Milvus did not answer.
    """
    return MilvusClient(uri=uri, token=token or "", timeout=timeout_s)


def allocate_timestamp(uri: str, token: str | None, timeout: float) -> int:
    """A fresh Milvus hybrid timestamp (physical milliseconds << 18 | a logical counter) from Milvus's timestamp
    oracle: the ``AllocTimestamp`` RPC of Milvus's ``MilvusService`` (milvus.proto), which pymilvus's
    ``MilvusClient`` does not wrap, on a gRPC channel opened for the call and closed after it.

    A timestamp allocated after a write was acknowledged is at least that write's (the oracle is monotonic), so it
    is a read-your-writes token: a read whose guarantee timestamp it is sees the write. The channel is not kept: an
    open channel across a Milvus crash holds its subchannel's reconnect back-off, which new channels to the same
    address share (see the module docstring).

    Raises:
        grpc.RpcError: Milvus unreachable or past ``timeout``; pymilvus.MilvusException: Milvus refused.
    """
    u = urlparse(uri if "://" in uri else f"http://{uri}")
    target = f"{u.hostname}:{u.port or 19530}"
    meta = [("authorization", base64.b64encode(token.encode()).decode())] if token else []
    channel = (
        grpc.secure_channel(target, grpc.ssl_channel_credentials())
        if u.scheme == "https"
        else grpc.insecure_channel(target)
    )
    try:
        r = milvus_pb2_grpc.MilvusServiceStub(channel).AllocTimestamp(
            milvus_pb2.AllocTimestampRequest(), timeout=timeout, metadata=meta
        )
    finally:
        channel.close()
    if r.status.code or r.status.error_code:
        raise MilvusException(r.status.code or r.status.error_code, f"AllocTimestamp: {r.status.reason}")
    return int(r.timestamp)


def answering_client(uri: str, token: str | None, timeout_s: float) -> MilvusClient | None:
    """A fresh connection to Milvus (a new channel, see the module docstring) that answered ``list_collections``
    within ``timeout_s``, or None (the connection closed)."""
    try:
        c = connect(uri, token, timeout_s)
    except Exception:
        return None
    try:
        c.list_collections(timeout=max(1, math.ceil(timeout_s)))
        return c
    except Exception:
        c.close()
        return None


def reachable(uri: str, token: str | None, timeout_s: float) -> bool:
    """Whether a fresh connection to Milvus answers within ``timeout_s`` (:func:`answering_client`, then closed)."""
    c = answering_client(uri, token, timeout_s)
    if c is not None:
        c.close()
    return c is not None


class BoundedClient:
    """A ``MilvusClient`` whose RPCs all carry ``timeout`` (an int, see the module docstring) unless given one, and
    whose connection :meth:`replace` can swap for a fresh one; :meth:`timestamp` asks Milvus's timestamp oracle.

    Args:
        client: the connected ``MilvusClient``.
        timeout_s: every call's timeout.
        uri, token: where :meth:`timestamp` connects (those of ``client``).
    """

    def __init__(self, client: MilvusClient, timeout_s: float, uri: str = "", token: str | None = None) -> None:
        self._client = client
        self.timeout = max(1, math.ceil(timeout_s))
        self._uri, self._token = uri, token
        self._lock = threading.Lock()
        self._released = False  # the current connection's close is scheduled (release)

    def timestamp(self) -> int:
        """A Milvus timestamp allocated now (see :func:`allocate_timestamp`)."""
        return allocate_timestamp(self._uri, self._token, self.timeout)

    def replace(self, client: MilvusClient) -> None:
        """Use ``client`` from now on; the old connection closes once calls still on it are past their timeout
        (closing it at once fails them with "Cannot invoke RPC on closed channel"), unless :meth:`release` did."""
        with self._lock:
            old, self._client = self._client, client
            released, self._released = self._released, False
        if not released:
            self._close_later(old)

    def release(self) -> None:
        """Close the current connection once calls still on it are past their timeout (once until :meth:`replace`).

        For while Milvus is unreachable (the breaker open: no call reaches the connection): an open channel keeps its
        gRPC subchannel's reconnect back-off alive for every new channel to Milvus (see the module docstring). Calls
        on the connection after it closed fail with "Cannot invoke RPC on closed channel"."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._close_later(self._client)

    def _close_later(self, client: MilvusClient) -> None:
        def _close() -> None:
            try:
                client.close()
            except Exception:
                pass

        t = threading.Timer(self.timeout + 5.0, _close)
        t.daemon = True
        t.start()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in _LOCAL or name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            kw.setdefault("timeout", self.timeout)
            return attr(*args, **kw)

        return call


def classify(e: BaseException) -> str | None:
    """``"unavailable"``, ``"not_loaded"`` or None (any other error) for an exception a Milvus call raised."""
    if isinstance(e, grpc.RpcError):
        code = e.code() if callable(getattr(e, "code", None)) else None
        return "unavailable" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else None
    if not isinstance(e, MilvusException):
        return None
    if e.code in NOT_LOADED or "not loaded" in (e.message or "") or "not fully loaded" in (e.message or ""):
        return "not_loaded"
    text = f"{e.message} {e.__cause__!r}"
    if any(
        s in text for s in ("Retry timeout", "Retry run out", "UNAVAILABLE", "DEADLINE_EXCEEDED", "Fail connecting")
    ):
        return "unavailable"
    return None


class Breaker:
    """Whether Milvus is known to be unreachable: opened by a call that found it so, closed by a probe.

    Args:
        retry_after_s: what the 503's ``Retry-After`` suggests.
    """

    def __init__(self, retry_after_s: float = 1.0) -> None:
        self.open_since: float | None = None
        self.reason = ""
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._checking, self._checked_at = False, 0.0

    def suspect(self, reachable: Callable[[], bool]) -> None:
        """A call is slow: check on a thread of its own (the backend's may all be stuck on a dead server) whether
        Milvus answers a fresh connection, and open the breaker if it does not. At most one check at a time and
        one a second; none while open."""
        with self._lock:
            if self.open_since is not None or self._checking or time.monotonic() - self._checked_at < 1.0:
                return
            self._checking = True

        def check() -> None:
            try:
                ok = reachable()
            finally:
                with self._lock:
                    self._checking, self._checked_at = False, time.monotonic()
            if not ok:
                self.trip("a call was slow and a fresh connection got no answer")

        threading.Thread(target=check, daemon=True, name="milvus-suspect").start()

    def trip(self, reason: str) -> None:
        """Record that Milvus was found unreachable."""
        with self._lock:
            if self.open_since is None:
                self.open_since, self.reason = time.monotonic(), reason

    def reset(self) -> bool:
        """Milvus answered again; True when it had been unreachable."""
        with self._lock:
            was, self.open_since = self.open_since is not None, None
            return was

    def check(self) -> None:
        """Raises :class:`BackendUnavailable` while open."""
        since = self.open_since
        if since is not None:
            raise BackendUnavailable(
                f"the vector store (Milvus) is unreachable since {time.monotonic() - since:.1f} s ({self.reason}); "
                "retry later",
                retry_after_s=self.retry_after_s,
            )
