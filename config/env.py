"""One typed reader for the environment.

Every setting that comes from the environment goes through ``env``: a value that
cannot be parsed stops start-up with ``ImproperlyConfigured`` naming the variable,
instead of surfacing later as a confusing error deep inside a library.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_MISSING: Any = object()


def _raw(name: str) -> str | None:
    value = os.environ.get(name)
    return None if value is None else value.strip()


def _parse(name: str, default: Any, parser: Callable[[str], T], expected: str) -> T:
    raw = _raw(name)
    if raw is None or raw == "":
        if default is _MISSING:
            raise ImproperlyConfigured(f"{name} is required ({expected}) and is not set.")
        return default
    try:
        return parser(raw)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{name}={raw!r} is not valid: expected {expected} ({exc}).") from None


def env_str(name: str, default: str | None = _MISSING) -> str:
    return _parse(name, default, str, "a string")


def env_bool(name: str, default: bool = _MISSING) -> bool:
    def parse(raw: str) -> bool:
        lowered = raw.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ValueError("use one of 1/0, true/false, yes/no, on/off")

    return _parse(name, default, parse, "a boolean")


def env_int(name: str, default: int = _MISSING, *, minimum: int | None = None, maximum: int | None = None) -> int:
    def parse(raw: str) -> int:
        value = int(raw)
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}")
        return value

    return _parse(name, default, parse, "an integer")


def env_float(name: str, default: float = _MISSING, *, minimum: float | None = None) -> float:
    def parse(raw: str) -> float:
        value = float(raw)
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return _parse(name, default, parse, "a number")


def env_choice(name: str, default: str = _MISSING, *, choices: tuple[str, ...]) -> str:
    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"use one of {', '.join(choices)}")
        return raw

    return _parse(name, default, parse, f"one of {', '.join(choices)}")


_RATE = re.compile(r"[0-9]+/(s|sec|second|m|min|minute|h|hour|d|day)")


def env_rate(name: str, default: str | None = _MISSING) -> str | None:
    """A rate limit "N/period" (period: second, minute, hour or day, as Django REST framework reads it);
    "off" for none (None)."""
    def parse(raw: str) -> str | None:
        if raw.lower() == "off":
            return None
        if not _RATE.fullmatch(raw):
            raise ValueError('write "N/second", "N/minute", "N/hour" or "N/day", or "off"')
        return raw

    return _parse(name, default, parse, 'a rate such as "10/minute"')


def env_list(name: str, default: list[str] = _MISSING) -> list[str]:
    return _parse(name, default, lambda raw: [item.strip() for item in raw.split(",") if item.strip()],
                  "a comma-separated list")


def env_url(name: str, default: str | None = _MISSING, *, schemes: tuple[str, ...]) -> str | None:
    def parse(raw: str) -> str:
        parts = urlsplit(raw)
        if parts.scheme not in schemes:
            raise ValueError(f"scheme must be one of {', '.join(schemes)}, got {parts.scheme or 'none'!r}")
        if parts.scheme in {"http", "https"} and not parts.netloc:
            raise ValueError("missing host")
        return raw

    return _parse(name, default, parse, f"a URL ({'/'.join(schemes)})")
