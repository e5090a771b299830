"""Point ids: Qdrant takes unsigned 64-bit integers and UUIDs; the native collections take unsigned integers and
any string. A UUID (any form Python's :class:`uuid.UUID` reads: hyphenated, 32 hex digits, braces, ``urn:uuid:``,
either case) is stored as the string id of its canonical lowercase hyphenated form, so ``"5C56C793..."`` and
``"5c56c793-..."`` are one point, as in Qdrant. A point written through the native API with a string id that is not
a UUID keeps it and is shown under it here (Qdrant itself would refuse such an id).

Qdrant API reference: ``ExtendedPointId`` (https://api.qdrant.tech/api-reference, schemas).
"""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import AfterValidator, Field, StrictInt, StrictStr

MAX_ID = 2**64 - 1


def canonical_id(pid: int | str) -> int | str:
    """The stored id of a Qdrant point id: the integer, or the UUID's canonical lowercase hyphenated form.

    Raises:
        ValueError: a string that is not a UUID (pydantic answers it as 422).
    """
    if isinstance(pid, int):
        return pid
    try:
        return str(uuid.UUID(pid))
    except ValueError:
        raise ValueError(f"{pid!r} is not a valid point id: use an unsigned integer or a UUID") from None


#: a Qdrant point id in a request body: validated and canonicalised
QdrantId = Annotated[
    Annotated[StrictInt, Field(ge=0, le=MAX_ID)] | Annotated[StrictStr, Field(min_length=1, max_length=64)],
    AfterValidator(canonical_id),
]


def path_id(raw: str) -> int | str:
    """A point id from a URL path segment: decimal digits are an integer id, anything else must be a UUID.

    Raises:
        ValueError: neither.
    """
    if raw.isascii() and raw.isdigit() and int(raw) <= MAX_ID:
        return int(raw)
    return canonical_id(raw)
