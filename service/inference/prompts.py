"""Prompts: the text a model wants prepended to an input (sentence-transformers' ``prompts``), chosen per request.

An artifact's manifest may carry ``prompts`` (name -> prefix) and ``default_prompt_name``
(:class:`artifact_contract.Manifest`). The prefix is prepended to each input *before* tokenisation, so truncation
and token counts include it, as ``SentenceTransformer.encode(prompt_name=...)`` does. Three ways to choose one:

* **by name** (TEI's ``prompt_name`` on ``/embed``, ``/tokenize``, ``/similarity``): strict, an unknown name is a
  :class:`PromptNotFound` (422 ``invalid_value`` in ``service.http.errors.ERROR_TABLE``) naming the model's prompts;
* **by role** (NVIDIA NIM's ``input_type`` on ``/v1/embeddings``; the collections' documents and queries): lenient,
  the role's prompt when the model has one, else the text unchanged (NIM's behaviour for symmetric models). Roles:
  ``query`` (the prompt named ``query``) and ``document`` (the prompt named ``passage``, else ``document``);
* **neither**: the model's ``default_prompt_name`` prompt when set, else nothing (sentence-transformers' rule).
"""

from __future__ import annotations

from collections.abc import Callable

from artifact_contract import Manifest

#: the prompt names each role takes, in order of preference
ROLE_PROMPTS: dict[str, tuple[str, ...]] = {"query": ("query",), "document": ("passage", "document")}
#: NIM's (and Voyage AI's) ``input_type`` values -> roles
INPUT_TYPES: dict[str, str] = {"query": "query", "passage": "document", "document": "document"}


class PromptNotFound(ValueError):
    """A request names a prompt the model does not define; ``param`` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def prompt_prefix(
    manifest: Manifest, model_id: str, *, name: str | None = None, role: str | None = None, param: str = "prompt_name"
) -> str:
    """The text to prepend to each input of a request to the model of ``manifest`` (``""``: none), as
    sentence-transformers' ``SentenceTransformer.encode(prompt_name=...)`` chooses it (name, else default), with TEI's
    ``prompt_name`` (``EmbedRequest``) and NVIDIA NIM's ``input_type`` (``/v1/embeddings``) on top.

    Args:
        manifest: the served model's manifest (its ``prompts`` and ``default_prompt_name``).
        model_id: ``name:version`` of that model, for error messages.
        name: a prompt name (TEI's ``prompt_name``), looked up strictly; takes precedence over ``role``.
        role: ``"query"`` or ``"document"`` (:data:`ROLE_PROMPTS`), looked up leniently.
        param: the request field named by the error.

    Raises:
        PromptNotFound: ``name`` is given and the model defines no prompts, or none of that name (the message lists
            the model's prompts).
        ValueError: ``role`` is not a role of :data:`ROLE_PROMPTS` (a caller's mistake, not a request's).
    """
    prompts = manifest.prompts or {}
    if name is not None:
        if name in prompts:
            return prompts[name]
        if not prompts:
            raise PromptNotFound(
                f"{param} {name!r}: model {model_id} defines no prompts; prepend the text yourself", param
            )
        have = ", ".join(repr(p) for p in sorted(prompts))
        raise PromptNotFound(f"{param} {name!r} is not a prompt of model {model_id}; its prompts: {have}", param)
    if role is not None:
        if role not in ROLE_PROMPTS:
            raise ValueError(f"unknown prompt role {role!r} (one of {sorted(ROLE_PROMPTS)})")
        return next((prompts[p] for p in ROLE_PROMPTS[role] if p in prompts), "")
    if manifest.default_prompt_name is not None:
        return prompts.get(manifest.default_prompt_name, "")
    return ""


def prompts_leaving_no_room(manifest: Manifest, n_tokens: Callable[[str], int]) -> str | None:
    """Why the prompts of ``manifest`` cannot be served, or None: a prompt whose tokens (``n_tokens(prompt)``, special
    tokens included, counted up to ``max_seq_length``) fill the whole ``max_seq_length`` leaves no token of an input
    after truncation from the right, so every input would embed to the same vector as the prompt alone.

    Args:
        manifest: the artifact's manifest (``prompts``, ``max_seq_length`` in tokens, special tokens included).
        n_tokens: the model's token count of a text alone (its special tokens included).
    """
    limit = manifest.max_seq_length
    over = {name: n for name, text in sorted((manifest.prompts or {}).items()) if (n := n_tokens(text)) >= limit}
    if not over:
        return None
    which = ", ".join(f"{name!r} ({'at least ' if n == limit else ''}{n} tokens)" for name, n in over.items())
    return (
        f"prompts {which} leave no room for the input within max_seq_length={limit} tokens (special tokens "
        "included): every input would embed to the same vector; shorten the prompt"
    )


def with_prefix(prefix: str, texts: list[str]) -> list[str]:
    """``texts`` with ``prefix`` prepended to each (the same list when ``prefix`` is empty)."""
    return [prefix + t for t in texts] if prefix else texts
