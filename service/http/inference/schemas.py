"""Request bodies of the HTTP API (pydantic). Responses are built as JSON bytes in the routes.

Input validation errors surface as 422 ``{"error": {..., "param": "<field>", "code": "invalid_value"}}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator


def _texts(v: Any) -> Any:
    """A string or a non-empty list of non-empty strings; wrong types and empties raise ValueError."""
    if isinstance(v, str):
        if v == "":
            raise ValueError("must not be an empty string")
        return v
    if isinstance(v, list):
        if not v:
            raise ValueError("must not be an empty list")
        for i, t in enumerate(v):
            if not isinstance(t, str):
                raise ValueError(f"item {i} must be a string, got {type(t).__name__}")
            if t == "":
                raise ValueError(f"item {i} must not be an empty string")
        return v
    raise ValueError(f"must be a string or a list of strings, got {type(v).__name__}")


def _sentence(v: Any) -> Any:
    if not isinstance(v, str):
        raise ValueError(f"must be a string, got {type(v).__name__}")
    if v == "":
        raise ValueError("must not be an empty string")
    return v


Texts = Annotated[str | list[str], BeforeValidator(_texts)]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _texts_or_tokens(v: Any) -> Any:
    """:func:`_texts`, or OpenAI's token forms (one non-empty list of integers, or a non-empty list of them), passed
    through for the route to refuse with its own message."""
    if (
        isinstance(v, list)
        and v
        and (all(_is_int(x) for x in v) or all(isinstance(x, list) and x and all(_is_int(t) for t in x) for x in v))
    ):
        return v
    return _texts(v)


#: ``input`` of ``/v1/embeddings``: text(s), or OpenAI's token arrays (accepted by the schema, refused by the route:
#: see :data:`TOKEN_IDS_REFUSED`)
TextsOrTokens = Annotated[str | list[str] | list[int] | list[list[int]], BeforeValidator(_texts_or_tokens)]

#: why ``input`` as token ids is refused (422 ``token_ids_unsupported``)
TOKEN_IDS_REFUSED = (
    "input holds token ids; this service embeds text with each model's own tokenizer and takes no token ids: ids "
    "made by another tokenizer (OpenAI SDK clients make tiktoken cl100k ids whatever the model) would embed "
    "unrelated text. Send the text itself. LangChain: OpenAIEmbeddings(..., check_embedding_ctx_length=False); "
    "LlamaIndex and the OpenAI SDK send text unless told otherwise"
)
Sentence = Annotated[str, BeforeValidator(_sentence)]


def as_list(v: str | list[str]) -> list[str]:
    """``"a"`` → ``["a"]``; lists unchanged."""
    return [v] if isinstance(v, str) else v


class EmbeddingsRequest(BaseModel):
    """``POST /v1/embeddings`` (OpenAI). ``dimensions`` truncates then L2-renormalises. ``input`` as token arrays
    (OpenAI's spec allows them) is refused with 422 ``token_ids_unsupported`` (:data:`TOKEN_IDS_REFUSED`).

    ``input_type`` is NVIDIA NIM's (NIM text embedding API reference, ``POST /v1/embeddings``; Voyage AI's
    ``document`` is taken too): ``query`` applies the model's ``query`` prompt, ``passage``/``document`` its
    ``passage`` (else ``document``) prompt, and a model without that prompt embeds the text unchanged (NIM's
    behaviour for symmetric models); absent, the model's ``default_prompt_name`` applies (:mod:`service.inference.prompts`).
    Any other value is a 422."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    input: TextsOrTokens
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, strict=True)
    user: str | None = None
    input_type: Literal["query", "passage", "document"] | None = Field(
        None,
        description="NVIDIA NIM's input_type: the model's 'query' prompt, or its 'passage' (else 'document') prompt, "
        "prepended before tokenisation; a model without that prompt embeds the text unchanged",
    )


#: TEI's ``truncation_direction``: which end of an over-long input is cut; TEI also takes the capitalised names
TruncationDirection = Annotated[
    Literal["left", "right"], BeforeValidator(lambda v: v.lower() if v in ("Left", "Right") else v)
]


#: TEI's ``prompt_name`` (text-embeddings-inference OpenAPI: ``EmbedRequest.prompt_name``)
PROMPT_NAME_DOC = (
    "a key of the model's prompts (its manifest's 'prompts', from sentence-transformers' config): that prompt is "
    "prepended to every input before tokenisation; null: the model's default_prompt_name, if any. A name the model "
    "does not define is a 422"
)


class TeiOptions(BaseModel):
    """TEI's encoding options (text-embeddings-inference OpenAPI: ``EmbedRequest``, ``SimilarityParameters``):
    ``truncate`` null means the default; ``prompt_name`` names a prompt of the model's (:data:`PROMPT_NAME_DOC`;
    an unknown one, or any on a model without prompts, is a 422 ``invalid_value``)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    truncate: Annotated[bool, Field(strict=True)] | None = None
    truncation_direction: TruncationDirection = "right"
    prompt_name: str | None = Field(None, description=PROMPT_NAME_DOC)


class EmbedRequest(TeiOptions):
    """``POST /embed`` and ``POST /`` (TEI's ``EmbedRequest``). Returns ``[[float]]``; ``truncate`` null means
    true."""

    inputs: Texts
    normalize: bool = Field(True, strict=True)
    dimensions: int | None = Field(None, ge=1, strict=True)
    model: str | None = None


class TokenizeRequest(BaseModel):
    """``POST /tokenize`` (TEI's ``TokenizeRequest``): ``[[{id, text, special, start, stop}]]``, untruncated; with a
    prompt (``prompt_name``, or the model's default) the tokens are those of the prompted input."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    inputs: Texts
    add_special_tokens: bool = Field(True, strict=True)
    prompt_name: str | None = Field(None, description=PROMPT_NAME_DOC)
    model: str | None = None


TokenIds = list[Annotated[int, Field(ge=0, strict=True)]]


class DecodeRequest(BaseModel):
    """``POST /decode`` (TEI's ``DecodeRequest``): ``ids`` one list of token ids or a non-empty list of them."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    ids: Annotated[TokenIds, Field(min_length=1)] | Annotated[list[TokenIds], Field(min_length=1)]
    skip_special_tokens: bool = Field(True, strict=True)
    model: str | None = None


class SimilarityInputs(BaseModel):
    """TEI's nested form ``{"inputs": {"source_sentence", "sentences"}}``."""

    model_config = ConfigDict(extra="forbid")
    source_sentence: Sentence
    sentences: Annotated[list[Sentence], Field(min_length=1)]


class SimilarityRequest(BaseModel):
    """``POST /similarity``: exactly one of ``source_sentence`` + ``sentences``, ``pairs``, or TEI's ``inputs``.

    Scores are cosine similarities in ``[-1, 1]``: ``sentences[i]`` vs ``source_sentence``,
    or ``pairs[i][0]`` vs ``pairs[i][1]``.
    """

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    source_sentence: Sentence | None = None
    sentences: Annotated[list[Sentence], Field(min_length=1)] | None = None
    pairs: Annotated[list[Annotated[list[Sentence], Field(min_length=2, max_length=2)]], Field(min_length=1)] | None = (
        None
    )
    inputs: SimilarityInputs | None = None
    parameters: TeiOptions | None = None  # TEI's SimilarityParameters
    model: str | None = None
    truncate: bool = Field(True, strict=True)

    @model_validator(mode="after")
    def _one_form(self) -> SimilarityRequest:
        if self.inputs is not None and self.source_sentence is None and self.sentences is None:
            self.source_sentence, self.sentences = self.inputs.source_sentence, self.inputs.sentences
        has_src = self.source_sentence is not None or self.sentences is not None
        if has_src and self.pairs is not None:
            raise ValueError("give either source_sentence + sentences, or pairs, not both")
        if has_src and (self.source_sentence is None or self.sentences is None):
            raise ValueError("source_sentence and sentences go together")
        if not has_src and self.pairs is None:
            raise ValueError("give source_sentence + sentences, or pairs")
        return self
