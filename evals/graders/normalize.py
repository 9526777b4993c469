"""The forms the graders compare and quote: Unicode-normalized text, JSON read out of an answer, dotted
paths, SQuAD tokens, and snippets safe to store in a rationale (Postgres refuses NUL and lone surrogates)."""

from __future__ import annotations

import json
import math
import re
import string
import unicodedata
from collections import Counter
from functools import lru_cache


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


# ------------------------------------------------------------------------------------- text helpers

_WHITESPACE = re.compile(r"\s+")


def _as_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _collapse(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _norm_text(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed: the comparison form for contains and JSON strings."""
    return _collapse(unicodedata.normalize("NFKC", text).casefold())


def _cut(text: str, limit: int) -> str:
    """A printable snippet for a rationale: at most `limit` characters, no NUL or lone surrogate (Postgres
    refuses both in text and JSON)."""
    text = "".join(ch for ch in text[:limit + 1] if ch != "\x00" and not 0xD800 <= ord(ch) <= 0xDFFF)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _quote(value, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return repr(_cut(text, limit))


def _sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?…" else text + "."


def _fmt(number: float) -> str:
    if number == int(number) and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.10g}"


class _Missing:
    def __repr__(self):
        return "<missing>"


_MISSING = _Missing()  # no value here (JSON null is None)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _loads(text: str):
    """The JSON value of `text` (NaN and Infinity refused), or _MISSING."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _MISSING


_FENCE = re.compile(r"```[ \t]*(?:json|JSON|json5)?[ \t]*\r?\n?(.*?)```", re.DOTALL)


def _fenced(text: str) -> list[str]:
    return [match.group(1) for match in _FENCE.finditer(text)]


def _find_json(text: str):
    """The JSON object in an answer: the whole text, else a fenced block, else the first {...} object in the
    text; _MISSING when there is none."""
    for candidate in [text.strip(), *(block.strip() for block in _fenced(text)[:5])]:
        value = _loads(candidate)
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    start = text.find("{")
    for _ in range(50):  # bounded: an answer full of braces is not worth a quadratic scan
        if start < 0:
            break
        try:
            value, _end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            value = _MISSING
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return _MISSING


def _get_path(value, path: str):
    """The value at a dotted path ("a.b.0.c"), or _MISSING. Keys match exactly, else case-insensitively."""
    for segment in path.split("."):
        if isinstance(value, dict):
            value = _lookup(value, segment)
            if value is _MISSING:
                return _MISSING
        elif isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
            value = value[int(segment)]
        else:
            return _MISSING
    return value


def _lookup(obj: dict, key: str):
    """obj[key], else the value of a key equal to it case-insensitively, else _MISSING."""
    if key in obj:
        return obj[key]
    folded = key.casefold()
    for candidate in obj:
        if isinstance(candidate, str) and candidate.casefold() == folded:
            return obj[candidate]
    return _MISSING


# ----------------------------------------------------------------------------------------- token F1

_ARTICLES = frozenset({"a", "an", "the"})
_ASCII_PUNCTUATION = frozenset(string.punctuation)
# CJK ideographs, kana, Hangul and emoji: each character is a token of its own
_SOLO = (r"\u2600-\u27bf\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff\u3400-\u4dbf"
         r"\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U0001f000-\U0001faff\U00020000-\U0003134f")
_TOKEN = re.compile(rf"[{_SOLO}]|[^\s{_SOLO}]+")


@lru_cache(maxsize=4096)
def _is_punctuation(ch: str) -> bool:
    return ch in _ASCII_PUNCTUATION or unicodedata.category(ch).startswith("P")


def _f1_tokens(text: str) -> list[str]:
    """SQuAD normalization, Unicode-aware: NFKC, casefold, punctuation removed, articles dropped."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(ch for ch in text if not _is_punctuation(ch))
    return [token for token in _TOKEN.findall(text) if token not in _ARTICLES]


def _token_f1(actual_tokens: list[str], expected_tokens: list[str]) -> tuple[float, float, float]:
    """(f1, precision, recall); both empty counts as a match, one empty as none."""
    if not actual_tokens or not expected_tokens:
        same = float(actual_tokens == expected_tokens)
        return same, same, same
    common = sum((Counter(actual_tokens) & Counter(expected_tokens)).values())
    if not common:
        return 0.0, 0.0, 0.0
    precision, recall = common / len(actual_tokens), common / len(expected_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall
