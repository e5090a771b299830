"""Operations that need an admin key, shared by the dialects (Qdrant's "global manage access", JWT RBAC in
https://qdrant.tech/documentation/guides/security/): recovering a collection from a snapshot location (the server
reads its own files and fetches URLs on the caller's behalf).

An admin key is one of ``admin_api_keys``, or of ``api_keys`` when no admin key is set (as the ``/admin`` routes:
``service.http.inference.admin``), sent as ``Authorization: Bearer <key>`` or Qdrant's ``api-key: <key>``. A service
started with no key at all has no access control (as Qdrant without an API key): everything is open to every caller.
"""

from __future__ import annotations

from fastapi import Request

from service.http.errors import APIError
from service.http.middleware import bearer_token, key_matches


def require_admin(request: Request, what: str) -> None:
    """Refuse ``what`` (words for the message) unless the request carries an admin key (module docstring).

    Raises:
        APIError: 403 ``insufficient_permissions`` (a valid key that is no admin key), 401 ``invalid_api_key``.
    """
    s = request.app.state.settings
    admin = [k.encode() for k in (s.admin_api_keys or s.api_keys)]
    if not admin:
        return
    bearer = bearer_token(request.headers.get("authorization", "").encode("latin-1"))
    api_key = request.headers.get("api-key", "").strip().encode("latin-1") or None
    if key_matches(bearer, admin) or key_matches(api_key, admin):
        return
    users = [k.encode() for k in s.api_keys]
    if key_matches(bearer, users) or key_matches(api_key, users):
        raise APIError(
            403,
            f"{what} needs an admin key (admin_api_keys): this API key is valid but lacks admin rights",
            code="insufficient_permissions",
        )
    raise APIError(
        401,
        f"{what} needs an admin key: send 'Authorization: Bearer <admin key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
