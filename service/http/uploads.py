"""Multipart snapshot uploads, shared by the dialects that recover a collection from an uploaded snapshot file
(the native ``POST /collections/{name}/snapshots/upload`` and Qdrant's "Recover from an uploaded snapshot")."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated, Any

from fastapi import Query, Request
from python_multipart import create_form_parser

from service.collections import snapshots
from service.collections.errors import InvalidCollectionRequest

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


async def receive_upload(request: Request, directory: Path) -> Path:
    """The ``snapshot`` file of a ``multipart/form-data`` upload, streamed to a file under ``directory/.downloads``
    (python-multipart's streaming parser; the middleware passes this route's body through unread and unbounded).
    Whatever else was uploaded, or everything if the upload fails, is deleted.

    Raises:
        InvalidCollectionRequest: not a multipart form, malformed, or not exactly one ``snapshot`` file field
            (``param`` ``snapshot``).
    """
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        raise InvalidCollectionRequest("send multipart/form-data with the file in a 'snapshot' field", "snapshot")
    dest = snapshots.download_path(directory)
    files: list[Any] = []
    cfg = {"UPLOAD_DIR": str(dest.parent), "MAX_MEMORY_FILE_SIZE": 0, "UPLOAD_DELETE_TMP": False}
    kept = None
    try:
        parser = create_form_parser({"Content-Type": ctype.encode()}, None, files.append, cfg)
        async for chunk in request.stream():
            await asyncio.to_thread(parser.write, chunk)
        await asyncio.to_thread(parser.finalize)
        found = [f for f in files if f.field_name == b"snapshot" and f.actual_file_name is not None]
        if len(found) != 1:
            raise InvalidCollectionRequest("the form must hold exactly one file field named 'snapshot'", "snapshot")
        found[0].close()
        os.rename(os.fsdecode(found[0].actual_file_name), dest)
        kept = found[0]
        return dest
    except ValueError as e:  # python-multipart's errors
        raise InvalidCollectionRequest(f"malformed multipart body: {e}", "snapshot") from e
    finally:
        for f in files:
            f.close()
            if f is not kept and f.actual_file_name is not None:
                Path(os.fsdecode(f.actual_file_name)).unlink(missing_ok=True)
