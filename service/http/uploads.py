"""Multipart snapshot uploads, shared by the dialects that recover a collection from an uploaded snapshot file
(the native ``POST /collections/{name}/snapshots/upload`` and Qdrant's "Recover from an uploaded snapshot").

The body (``multipart/form-data``, RFC 7578) is parsed as it streams in (python-multipart's ``MultipartParser``), and
only the file of the ``snapshot`` field is kept, written straight to ``<snapshots dir>/.downloads``; the form is
bounded: at most :data:`MAX_PARTS` parts, one file (the snapshot), :data:`MAX_FIELD_BYTES` per other field (read and
dropped, never held), the file at most ``collections_snapshot_max_bytes``, and no more than
``collections_snapshot_idle_timeout_s`` between two pieces of the body (a drip is answered 408). The file is removed
on every path but success (refusal, malformed body, client gone, cancellation). An uploaded snapshot is untrusted:
its FAISS index is rebuilt from its store, never read (``Recovery.recover_file``), and its model must be loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated, Any, BinaryIO

from fastapi import Query, Request
from python_multipart.multipart import MultipartParser, parse_options_header

from service.collections import snapshots
from service.collections.errors import InvalidCollectionRequest
from service.collections.service import CollectionService
from service.http.errors import APIError

#: the ``?checksum=`` of an upload: the SHA-256 (hex) the uploaded file must have
Checksum = Annotated[str | None, Query(pattern=r"^[0-9a-fA-F]{64}$", description="SHA-256 hex to verify")]
#: the upload's request body, documented (the route reads the stream itself: :func:`receive_upload`)
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"snapshot": {"type": "string", "format": "binary"}},
                    "required": ["snapshot"],
                }
            }
        },
    }
}
MAX_PARTS = 16  # parts of one upload form
MAX_FIELD_BYTES = 64 * 1024  # bytes of a form field other than the snapshot file
MAX_HEADER_BYTES = 8192  # bytes of one part's headers


class _Form:
    """The callbacks of one upload's parser: the ``snapshot`` file part goes to ``dest`` (at most ``max_bytes``),
    the rest is counted and dropped, within the bounds of the module docstring."""

    def __init__(self, dest: Path, max_bytes: int) -> None:
        self.dest, self.max_bytes = dest, max_bytes
        self.parts = self.files = self.field_bytes = self.file_bytes = 0
        self.header_name, self.header_value, self.headers_bytes = b"", b"", 0
        self.disposition: bytes = b""
        self.out: BinaryIO | None = None
        self.snapshot = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": self.header_field,
            "on_header_value": self.header_value_data,
            "on_header_end": self.header_end,
            "on_headers_finished": self.headers_finished,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
        }

    def part_begin(self) -> None:
        self.parts += 1
        if self.parts > MAX_PARTS:
            raise _refused(f"the form has more than {MAX_PARTS} parts")
        self.disposition, self.headers_bytes, self.field_bytes = b"", 0, 0

    def _count_header(self, n: int) -> None:
        self.headers_bytes += n
        if self.headers_bytes > MAX_HEADER_BYTES:
            raise _refused(f"a part's headers are longer than {MAX_HEADER_BYTES} bytes")

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_name += data[start:end]

    def header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._count_header(end - start)
        self.header_value += data[start:end]

    def header_end(self) -> None:
        if self.header_name.strip().lower() == b"content-disposition":
            self.disposition = self.header_value
        self.header_name, self.header_value = b"", b""

    def headers_finished(self) -> None:
        _, opts = parse_options_header(self.disposition)
        if b"filename" not in opts:
            return  # a plain field: counted and dropped
        self.files += 1
        if opts.get(b"name") != b"snapshot" or self.files > 1:
            raise _refused("the form must hold exactly one file field named 'snapshot' (and no other file)")
        self.out = open(self.dest, "wb")
        self.snapshot = True

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if self.out is None:
            self.field_bytes += end - start
            if self.field_bytes > MAX_FIELD_BYTES:
                raise _refused(f"a form field other than the snapshot is larger than {MAX_FIELD_BYTES} bytes")
            return
        self.file_bytes += end - start
        if self.file_bytes > self.max_bytes:
            raise APIError(
                413,
                f"the snapshot is larger than collections_snapshot_max_bytes={self.max_bytes}",
                param="snapshot",
                code="payload_too_large",
            )
        self.out.write(data[start:end])

    def part_end(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None


def _refused(message: str) -> InvalidCollectionRequest:
    return InvalidCollectionRequest(message, "snapshot")


async def receive_upload(request: Request, directory: Path, max_bytes: int, idle_s: float) -> Path:
    """The ``snapshot`` file of a ``multipart/form-data`` upload, streamed to a file under ``directory/.downloads``
    within the bounds of the module docstring (the middleware passes this route's body through unread).

    Raises:
        InvalidCollectionRequest: not a multipart form, malformed, more parts, files or field bytes than allowed,
            or not exactly one ``snapshot`` file field (``param`` ``snapshot``).
        APIError: 413 ``payload_too_large`` (the file is larger than ``max_bytes``), 408 ``upload_timeout``
            (nothing received for ``idle_s`` seconds).
    """
    ctype = request.headers.get("content-type", "")
    media, opts = parse_options_header(ctype)
    if media != b"multipart/form-data" or not opts.get(b"boundary"):
        raise InvalidCollectionRequest("send multipart/form-data with the file in a 'snapshot' field", "snapshot")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + MAX_PARTS * (MAX_FIELD_BYTES + MAX_HEADER_BYTES):
        raise APIError(
            413, f"the upload is larger than collections_snapshot_max_bytes={max_bytes}", code="payload_too_large"
        )
    dest = snapshots.download_path(directory)
    form = _Form(dest, max_bytes)
    writing: asyncio.Future | None = None
    ok = False
    try:
        try:
            parser = MultipartParser(opts[b"boundary"], form.callbacks())
        except ValueError as e:  # python-multipart's FormParserError: a boundary too long
            raise InvalidCollectionRequest(f"malformed multipart body: {e}", "snapshot") from None
        body = request.stream().__aiter__()
        while True:
            try:
                async with asyncio.timeout(idle_s):
                    chunk = await body.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise APIError(
                    408,
                    f"the upload sent nothing for {idle_s:g} s (collections_snapshot_idle_timeout_s)",
                    code="upload_timeout",
                ) from None
            writing = asyncio.ensure_future(asyncio.to_thread(parser.write, chunk))
            await asyncio.shield(writing)
        writing = asyncio.ensure_future(asyncio.to_thread(parser.finalize))
        await asyncio.shield(writing)
        if not form.snapshot or form.out is not None:
            raise _refused("the form must hold exactly one file field named 'snapshot'")
        ok = True
        return dest
    except ValueError as e:  # python-multipart's parse errors
        raise InvalidCollectionRequest(f"malformed multipart body: {e}", "snapshot") from None
    finally:
        if writing is not None and not writing.done():  # cancelled: let the chunk in hand finish, then clean up
            with contextlib.suppress(BaseException):
                await asyncio.wait([writing])
        form.close()
        if not ok:
            dest.unlink(missing_ok=True)


def upload_limits(svc: CollectionService) -> tuple[int, float]:
    """``(max bytes, idle seconds)`` of an upload: ``collections_snapshot_max_bytes`` and
    ``collections_snapshot_idle_timeout_s`` of the service's backend."""
    s = svc.backend.settings
    return int(s.snapshot_max_bytes), float(s.snapshot_idle_timeout_s)
