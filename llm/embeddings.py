"""Embedding providers: OpenAI or any OpenAI-compatible server (an LLM_PROVIDERS entry), and two
deterministic offline ones: wordllama (a real local model, the default) and a feature hasher.

    provider = get_embedding_provider()
    result = provider.embed(["first text", "second text"])   # result.vectors: float32 array (n, dimensions)
    query = provider.embed_query("what is lineage?")          # one float32 vector

Both return unit-length vectors of ``settings.EMBEDDING_DIMENSIONS`` values, so cosine distance is
the natural metric. Which provider answers is ``settings.EMBEDDING_PROVIDER``: ``openai`` when an
API key is set, else ``offline`` (``EMBEDDING_MODEL`` ``wordllama-l2-supercat``, or ``offline-hash-v2``),
or any provider of ``LLM_PROVIDERS``.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from llm.providers import OFFLINE_PROVIDER, one_per_process, provider_config
from llm.retry import RetryPolicy, retry_after_of, wait
from llm.usage import Usage, estimate_tokens, record_usage

logger = logging.getLogger("llm.embeddings")


class EmbeddingError(Exception):
    """The provider refused the request for good (bad input, bad key, wrong dimensions)."""


class TransientEmbeddingError(EmbeddingError):
    """The provider did not answer in time or kept rate-limiting: worth retrying later."""


@dataclass(frozen=True)
class EmbeddingResult:
    vectors: np.ndarray  # float32, shape (len(texts), dimensions), rows of unit length
    usage: Usage


class EmbeddingProvider(ABC):
    name: str
    model: str
    dimensions: int

    @abstractmethod
    def _embed(self, texts: list[str]) -> EmbeddingResult: ...

    def embed(self, texts: Sequence[str]) -> EmbeddingResult:
        """Embed `texts` (any number; batched as the provider needs) and record the usage."""
        texts = list(texts)
        if not texts:
            return EmbeddingResult(np.zeros((0, self.dimensions), dtype=np.float32),
                                   Usage(provider=self.name, model=self.model))
        result = self._embed(texts)
        if result.vectors.shape != (len(texts), self.dimensions):
            raise EmbeddingError(
                f"{self.name} model {self.model!r} returned vectors of shape {result.vectors.shape}, expected "
                f"({len(texts)}, {self.dimensions}): set EMBEDDING_DIMENSIONS to the model's width or choose "
                "a model that supports it."
            )
        record_usage(result.usage)
        return result

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text]).vectors[0]


# ------------------------------------------------------------------------------------------- offline

# words are split at whitespace and punctuation (a translate and a split: several times faster than a regex)
_PUNCTUATION = str.maketrans({c: " " for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~\u2018\u2019\u201c\u201d\u2013\u2014"
                                             "\u2026\u00ab\u00bb\u00a1\u00bf\u00b7\u2022"})
# dropped before hashing so that shared function words do not make every pair of texts look alike
STOP_WORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "he", "her", "his", "i",
    "if", "in", "into", "is", "it", "its", "of", "on", "or", "our", "she", "so", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "to", "was", "we", "were", "what", "when", "which", "who", "will",
    "with", "you", "your",
))
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_BIGRAM_MULT = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads the bits of combined hashes (numpy uint64 arithmetic wraps)."""
    h = h ^ (h >> np.uint64(30))
    h = h * _MIX1
    h = h ^ (h >> np.uint64(27))
    h = h * _MIX2
    return h ^ (h >> np.uint64(31))


# every character str.split() treats as whitespace (all below U+3001), mapped to a plain space, so the
# UTF-8 bytes of a cleaned text split into words at byte 0x20 alone
_SEPARATORS = str.maketrans(
    {**{c: " " for c in map(chr, range(0x3001)) if c.isspace()},
     **{c: " " for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~\u2018\u2019\u201c\u201d\u2013\u2014"
                        "\u2026\u00ab\u00bb\u00a1\u00bf\u00b7\u2022"}}
)
_POLY = np.uint64(0xD6E8FEB86659FD93)  # odd, so it has an inverse modulo 2**64
_POLY_INVERSE = np.uint64(pow(0xD6E8FEB86659FD93, -1, 2**64))
_LENGTH_MULT = np.uint64(0xC2B2AE3D27D4EB4F)
_LOW46 = np.uint64((1 << 46) - 1)
_MAX_TEXTS = 1 << 16  # texts per hashing pass: a feature key holds the text's index in its top 16 bits
_MAX_BYTES = 1 << 20  # bytes per hashing pass (more only for a single longer text): bounds the power tables


class _Powers:
    """P**j and P**-j modulo 2**64 for j < size, grown on demand (shared; replaced, never mutated)."""

    def __init__(self):
        self.forward = self.inverse = np.ones(1, dtype=np.uint64)

    def get(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        forward, inverse = self.forward, self.inverse
        if len(forward) < size:
            size = max(size, 2 * len(forward), 1 << 16)
            # 1, P, P**2, ... and 1, P**-1, P**-2, ... (uint64 products wrap modulo 2**64)
            forward = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _POLY, dtype=np.uint64))])
            inverse = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _POLY_INVERSE, dtype=np.uint64))])
            self.forward, self.inverse = forward, inverse
        return forward, inverse


class OfflineEmbeddingProvider(EmbeddingProvider):
    """Deterministic feature hashing, for demos, tests and benchmarks; never a real model.

    Each text is lower-cased and split into words at whitespace and punctuation; common function
    words are dropped (unless nothing else is left). Every distinct word (weight 1) and pair of
    adjacent words (weight 0.5), scaled by 1 + log of its count in the text, is hashed into one of
    `dimensions` buckets with a hashed sign; the bucket sums form the vector, scaled to unit
    length. Texts sharing words therefore land near each other, and the same text always gives
    the same vector, in every process, on every machine and in any batch.

    ``offline-hash-v2`` (the default) hashes a whole batch with numpy: the cleaned texts' UTF-8
    bytes end to end, word boundaries found with array comparisons, each word hashed as a
    polynomial over its bytes (prefix sums modulo 2**64) and mixed with splitmix64, so no Python
    code runs per word. ``offline-hash-v1`` (BLAKE2b per distinct word, a Python loop over the
    words) is kept, bit for bit, for vectors stored with it; its vectors differ from v2's, so a
    change of model offers a re-embed like any other.
    """

    name = "offline"
    BIGRAM_WEIGHT = 0.5
    LEGACY_MODEL = "offline-hash-v1"
    _CACHE_LIMIT = 500_000

    def __init__(self, *, dimensions: int, model: str = "offline-hash-v2"):
        self.dimensions = dimensions
        self.model = model
        self._hashes: dict[str, int] = {}
        self._lock = threading.Lock()
        if model == self.LEGACY_MODEL:
            self._stop_hashes = frozenset(self._word_hash(word) for word in STOP_WORDS)
        else:
            self._powers = _Powers()
            words = " ".join(sorted(STOP_WORDS)).encode()
            self._stop_array = np.sort(self._hash_words(np.frombuffer(words, dtype=np.uint8))[0])

    def _embed(self, texts: list[str]) -> EmbeddingResult:
        if self.model == self.LEGACY_MODEL:
            vectors = self._embed_v1(texts)
        else:
            encoded = [text.lower().translate(_SEPARATORS).encode() for text in texts]
            parts, start, size = [], 0, 0
            for end, data in enumerate(encoded):
                if end > start and (size + len(data) > _MAX_BYTES or end - start == _MAX_TEXTS):
                    parts.append(self._embed_v2(texts[start:end], encoded[start:end]))
                    start, size = end, 0
                size += len(data) + 1
            parts.append(self._embed_v2(texts[start:], encoded[start:]))
            vectors = parts[0] if len(parts) == 1 else np.concatenate(parts)
        tokens = sum(estimate_tokens(text) for text in texts)
        return EmbeddingResult(vectors, Usage.priced(provider=self.name, model=self.model, input_tokens=tokens))

    # ---- v2: the whole batch in numpy

    def _hash_words(self, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(word hashes, word start offsets) of the space-separated words in `data` (UTF-8 bytes)."""
        size = len(data)
        if not size:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        space = data == 32
        word = ~space
        starts = np.flatnonzero(word & np.concatenate(([True], space[:-1])))
        ends = np.flatnonzero(word & np.concatenate((space[1:], [True]))) + 1
        forward, inverse = self._powers.get(size + 1)
        # prefix[i] = sum of data[j] * P**j for j < i; a word's hash is its slice times P**-start
        prefix = np.zeros(size + 1, dtype=np.uint64)
        np.cumsum(data.astype(np.uint64) * forward[:size], out=prefix[1:])
        poly = (prefix[ends] - prefix[starts]) * inverse[starts]
        return _mix(poly ^ ((ends - starts).astype(np.uint64) * _LENGTH_MULT)), starts

    def _embed_v2(self, texts: list[str], encoded: list[bytes]) -> np.ndarray:
        """Vectors of `texts`, given as lower-cased, separator-cleaned UTF-8 (`encoded`)."""
        count, dims = len(texts), self.dimensions
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=count)
        offsets = np.concatenate(([0], np.cumsum(lengths + 1)[:-1]))  # each text is followed by one space
        hashes, starts = self._hash_words(np.frombuffer(b" ".join(encoded), dtype=np.uint8))
        owners = np.searchsorted(offsets, starts, side="right") - 1
        # function words go, unless a text has nothing else
        stop = np.isin(hashes, self._stop_array)
        if stop.any():
            content = np.bincount(owners[~stop], minlength=count)
            keep = ~stop | (content[owners] == 0)
            hashes, owners = hashes[keep], owners[keep]
        words = np.bincount(owners, minlength=count)
        if not words.all():  # punctuation only (or empty): one feature of the raw text, never a zero vector
            empty = np.flatnonzero(words == 0)
            raw = [("\x00" + texts[i]).encode().replace(b" ", b"\x00") for i in empty]
            extra, _ = self._hash_words(np.frombuffer(b" ".join(raw), dtype=np.uint8))
            order = np.argsort(np.concatenate([owners, empty]), kind="stable")
            hashes, owners = np.concatenate([hashes, extra])[order], np.concatenate([owners, empty])[order]
        # word pairs only where both words belong to the same text
        pairs = owners[:-1] == owners[1:]
        bigrams = _mix(hashes[:-1][pairs] * _BIGRAM_MULT + hashes[1:][pairs])
        # a key per (text, feature): the text in the top 16 bits, bit 47 marks a word pair, and the
        # feature's top 47 bits below (bit 46 its sign, the 46 under it choose the bucket); sorting
        # the keys groups each text's repeats of a feature, whose count gives its 1 + log(tf) weight
        owners64 = owners.astype(np.uint64) << np.uint64(48)
        keys = np.concatenate([owners64 | (_mix(hashes) >> np.uint64(17)),
                               owners64[:-1][pairs] | np.uint64(1 << 47) | (bigrams >> np.uint64(17))])
        keys.sort()
        first = np.concatenate(([True], keys[1:] != keys[:-1]))
        starts = np.flatnonzero(first)
        tf = np.diff(np.append(starts, len(keys)))
        keys = keys[starts]
        weights = np.where(keys & np.uint64(1 << 47), self.BIGRAM_WEIGHT, 1.0) * (1.0 + np.log(tf))
        weights *= 1.0 - 2.0 * ((keys >> np.uint64(46)) & np.uint64(1)).astype(np.float64)  # hashed sign
        buckets = (keys >> np.uint64(48)).astype(np.int64) * dims + ((keys & _LOW46) % np.uint64(dims)).astype(np.int64)
        sums = np.bincount(buckets, weights=weights, minlength=count * dims).reshape(count, dims)
        return _unit_rows(sums)

    # ---- v1: BLAKE2b per word (kept for vectors stored with offline-hash-v1)

    def _word_hash(self, word: str) -> int:
        value = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little") or 1
        if len(self._hashes) >= self._CACHE_LIMIT:
            with self._lock:
                self._hashes.clear()
        self._hashes[word] = value
        return value

    def _text_hashes(self, text: str) -> list[int]:
        words = text.lower().translate(_PUNCTUATION).split()
        get = self._hashes.get
        hashes = [get(w) or self._word_hash(w) for w in words]
        kept = [h for h in hashes if h not in self._stop_hashes]
        if kept:
            return kept
        if hashes:  # function words only: keep them rather than return nothing
            return hashes
        return [self._word_hash("\x00" + text)]  # punctuation only: one bucket, never a zero vector

    def _embed_v1(self, texts: list[str]) -> np.ndarray:
        # the whole batch is hashed in one pass: word hashes of every text end to end, a row index
        # per word, and word pairs kept only where both words belong to the same text
        per_text = [self._text_hashes(text) for text in texts]
        lengths = np.fromiter((len(h) for h in per_text), dtype=np.int64, count=len(per_text))
        hashes = np.fromiter((h for text_hashes in per_text for h in text_hashes), dtype=np.uint64,
                             count=int(lengths.sum()))
        rows = np.repeat(np.arange(len(texts), dtype=np.int64), lengths)
        pairs = rows[:-1] == rows[1:]
        bigrams = _mix(hashes[:-1][pairs] * _BIGRAM_MULT + hashes[1:][pairs])
        features = np.concatenate([_mix(hashes), bigrams])
        owners = np.concatenate([rows, rows[:-1][pairs]])
        base = np.concatenate([np.ones(len(hashes)), np.full(len(bigrams), self.BIGRAM_WEIGHT)])
        # sublinear term frequency (1 + log tf per distinct feature of a text), so the words a text
        # repeats most (the commonest words of the language) do not drown the ones that say what it is about
        keys = features ^ (owners.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93))
        _unique, first, counts = np.unique(keys, return_index=True, return_counts=True)
        features, owners = features[first], owners[first]
        weights = base[first] * (1.0 + np.log(counts))
        weights *= 1.0 - 2.0 * (features >> np.uint64(63)).astype(np.float64)  # hashed sign
        buckets = (features % np.uint64(self.dimensions)).astype(np.int64) + owners * self.dimensions
        counts = np.bincount(buckets, weights=weights, minlength=len(texts) * self.dimensions)
        return _unit_rows(counts.reshape(len(texts), self.dimensions))


def _unit_rows(sums: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    # opposite signs can cancel out exactly: fall back to a fixed unit vector rather than zero
    zero = norms[:, 0] == 0
    if zero.any():
        sums[zero, 0], norms[zero] = 1.0, 1.0
    return (sums / norms).astype(np.float32)


# ----------------------------------------------------------------------------------------- wordllama


class WordLlamaEmbeddingProvider(EmbeddingProvider):
    """A real embedding model on this machine: wordllama's ``l2_supercat`` static token embeddings
    (distilled from an LLM's token embedding table, mean-pooled; 256 dimensions, truncatable to 128 or
    64), whose weights and tokenizer ship inside the wordllama wheel. Loaded from the package's own
    folder with downloads disabled, so it never reaches the network. Deterministic, semantic (texts
    about the same thing in different words land near each other), and free."""

    name = "offline"
    MODEL = "wordllama-l2-supercat"
    WIDTHS = (64, 128, 256)

    def __init__(self, *, dimensions: int = 256, model: str = MODEL):
        if model != self.MODEL:
            raise ImproperlyConfigured(f"EMBEDDING_MODEL={model!r} is not an offline model: use {self.MODEL!r}, "
                                       "'offline-hash-v2' or 'offline-hash-v1'.")
        if dimensions not in self.WIDTHS:
            raise ImproperlyConfigured(f"EMBEDDING_DIMENSIONS={dimensions} is not a width of {model}: use 64, 128 "
                                       "or 256.")
        from pathlib import Path

        import wordllama

        self.model = model
        self.dimensions = dimensions
        # its own folder holds the bundled weights and tokenizer; the default cache path would miss the
        # tokenizer and try to download it
        assert wordllama.__file__ is not None  # a regular package, installed from its wheel
        self._wordllama = wordllama.WordLlama.load(
            config="l2_supercat", dim=256, trunc_dim=None if dimensions == 256 else dimensions,
            cache_dir=Path(wordllama.__file__).parent, disable_download=True)

    def _embed(self, texts: list[str]) -> EmbeddingResult:
        # unnormalised, so a text with no token (empty, or nothing the tokenizer keeps) gets the fixed
        # fallback vector of _unit_rows instead of NaNs
        vectors = np.nan_to_num(np.asarray(self._wordllama.embed(texts, norm=False), dtype=np.float64))
        tokens = sum(estimate_tokens(text) for text in texts)
        return EmbeddingResult(_unit_rows(vectors.reshape(len(texts), self.dimensions)),
                               Usage.priced(provider=self.name, model=self.model, input_tokens=tokens))


# -------------------------------------------------------------------------------------------- openai


class OpenAIEmbeddingProvider(EmbeddingProvider):
    """The OpenAI embeddings endpoint through the official client, with any OpenAI-compatible base URL
    (vLLM, Ollama, LM Studio). Requests hold at most `batch_size` texts; rate limits, timeouts,
    connection errors and 5xx answers are retried as chat calls are (llm/retry.py: Retry-After,
    retry-after-ms, LLM_MAX_RETRIES), other errors fail at once with the server's message."""

    MAX_INPUT_CHARS = 24_000  # about 6,000 tokens: under the 8,191-token input limit

    def __init__(self, *, model: str, dimensions: int, api_key: str = "", base_url: str | None = None,
                 batch_size: int = 64, timeout: float = 60.0, retry: RetryPolicy | None = None,
                 name: str = "openai", client=None):
        import openai

        self.name = name
        self.model = model
        self.dimensions = dimensions
        self.batch_size = batch_size
        self.retry = retry
        self._openai = openai
        # the client's own retries are off: ours know about Retry-After and count every attempt
        self.client = client or openai.OpenAI(api_key=api_key or "no-key", base_url=base_url, timeout=timeout,
                                              max_retries=0)
        # text-embedding-3 models shorten their vectors on request; other models have a fixed width
        self.send_dimensions = model.startswith("text-embedding-3")

    def _embed(self, texts: list[str]) -> EmbeddingResult:
        vectors, usage = [], Usage(provider=self.name, model=self.model)
        for start in range(0, len(texts), self.batch_size):
            batch = [(text[: self.MAX_INPUT_CHARS] or " ") for text in texts[start : start + self.batch_size]]
            batch_vectors, tokens = self._request(batch)
            vectors.append(batch_vectors)
            usage = usage + Usage.priced(provider=self.name, model=self.model, input_tokens=tokens)
        return EmbeddingResult(np.concatenate(vectors), usage)

    def _request(self, batch: list[str]) -> tuple[np.ndarray, int]:
        openai = self._openai
        kwargs = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self.send_dimensions:
            kwargs["dimensions"] = self.dimensions
        policy = self.retry or RetryPolicy.from_settings()
        attempt = 0
        while True:
            try:
                response = self.client.embeddings.create(**kwargs)
                break
            except (openai.RateLimitError, openai.APITimeoutError, openai.APIConnectionError,
                    openai.InternalServerError) as exc:
                attempt += 1
                delay = policy.delay(attempt, retry_after=retry_after_of(exc))
                if delay is None:
                    raise TransientEmbeddingError(
                        f"embedding request failed after {attempt} attempts: {type(exc).__name__}: {exc}"
                    ) from exc
                logger.warning("embedding request failed (%s), retry %d/%d in %.1fs",
                               type(exc).__name__, attempt, policy.max_retries, delay)
                wait(delay)
            except openai.APIStatusError as exc:
                raise EmbeddingError(f"the embedding server refused the request ({exc.status_code}): "
                                     f"{_server_message(exc)}") from exc
        data = sorted(response.data, key=lambda item: item.index)
        if len(data) != len(batch):
            raise EmbeddingError(f"the embedding server returned {len(data)} vectors for {len(batch)} texts")
        vectors = np.asarray([item.embedding for item in data], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dimensions:
            width = vectors.shape[1] if vectors.ndim == 2 else "?"
            raise EmbeddingError(
                f"model {self.model!r} returned {width}-dimensional vectors but EMBEDDING_DIMENSIONS is "
                f"{self.dimensions}: choose a model of that width (text-embedding-3 models accept any)."
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms == 0, 1, norms)
        usage = getattr(response, "usage", None)
        tokens = getattr(usage, "prompt_tokens", None) or sum(estimate_tokens(text) for text in batch)
        return vectors, int(tokens)


def _server_message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    return str(getattr(exc, "message", exc))


# ------------------------------------------------------------------------------------------ factory


@lru_cache(maxsize=8)
def _offline_provider(model: str, dimensions: int) -> EmbeddingProvider:
    if model.startswith("offline-hash-"):
        return OfflineEmbeddingProvider(dimensions=dimensions, model=model)
    return WordLlamaEmbeddingProvider(dimensions=dimensions, model=model)


@one_per_process
def _openai_provider(name: str, model: str, dimensions: int, api_key: str, base_url: str | None, batch_size: int,
                     timeout: int) -> EmbeddingProvider:
    return OpenAIEmbeddingProvider(name=name, model=model, dimensions=dimensions, api_key=api_key, base_url=base_url,
                                   batch_size=batch_size, timeout=timeout)


def get_embedding_provider() -> EmbeddingProvider:
    """The provider the settings name (one instance per configuration, shared by the process):
    EMBEDDING_PROVIDER "offline", "openai", or any LLM_PROVIDERS entry (its base URL and key)."""
    name, model, dimensions = settings.EMBEDDING_PROVIDER, settings.EMBEDDING_MODEL, settings.EMBEDDING_DIMENSIONS
    if name == OFFLINE_PROVIDER:
        return _offline_provider(model, dimensions)
    config = provider_config(name)
    if config is None:
        raise ImproperlyConfigured(f"EMBEDDING_PROVIDER={name!r} is not known: use 'offline', 'openai' or a "
                                   "provider of LLM_PROVIDERS.")
    api_key = config.api_key()
    if api_key is None:
        raise ImproperlyConfigured(f"EMBEDDING_PROVIDER={name!r} has no API key (set {config.api_key_env}).")
    return _openai_provider(name, model, dimensions, api_key, config.url(), settings.EMBEDDING_BATCH_SIZE,
                            settings.LLM_TIMEOUT_SECONDS)
