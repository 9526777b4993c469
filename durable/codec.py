"""Payload encoding for the engine: JSON through Django's encoder, optionally encrypted.

With DURABLE_PAYLOAD_KEYS set, every payload is written as ``enc1:<Fernet token>``
(MultiFernet: the first key encrypts, every key decrypts, so keys rotate). Reads accept
plain JSON too, so turning encryption on does not strand older rows.

A payload that cannot be decoded (a wrong key, a row edited by hand) reads as missing
(None). It is reported once per row and column through the reporter (a logger warning
by default; replace it with ``on_corrupt_payload``), and it never breaks other reads.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder

from durable.errors import Undecodable

logger = logging.getLogger("durable.codec")

ENCRYPTED_PREFIX = "enc1:"


@dataclass(frozen=True)
class CorruptPayload:
    column: str
    row: str
    message: str


def _default_reporter(report: CorruptPayload) -> None:
    logger.warning("durable: undecodable payload in %s of %s (%s); it reads as missing",
                   report.column, report.row, report.message)


_reporter: Callable[[CorruptPayload], None] = _default_reporter
_reported: set[tuple[str, str]] = set()
_lock = threading.Lock()


def on_corrupt_payload(reporter: Callable[[CorruptPayload], None]) -> Callable[[CorruptPayload], None]:
    """Install a process-wide reporter; returns the previous one. Resets the once-per-row memory."""
    global _reporter
    with _lock:
        previous, _reporter = _reporter, reporter
        _reported.clear()
    return previous


@lru_cache(maxsize=4)
def _fernet(keys: tuple[str, ...]) -> MultiFernet | None:
    if not keys:
        return None
    return MultiFernet([Fernet(key.encode() if isinstance(key, str) else key) for key in keys])


def _cipher() -> MultiFernet | None:
    return _fernet(tuple(getattr(settings, "DURABLE_PAYLOAD_KEYS", ()) or ()))


_encoder = DjangoJSONEncoder(separators=(",", ":"), ensure_ascii=False)


def encode(value) -> str:
    """Serialise a payload for storage (JSON, encrypted when payload keys are configured)."""
    text = _encoder.encode(value)
    cipher = _cipher()
    if cipher is None:
        return text
    return ENCRYPTED_PREFIX + cipher.encrypt(text.encode()).decode()


def decode_strict(text: str):
    """Decode a stored payload, raising Undecodable when it cannot be read. '' is None."""
    if not text:
        return None
    if text.startswith(ENCRYPTED_PREFIX):
        cipher = _cipher()
        if cipher is None:
            raise Undecodable("payload is encrypted and no DURABLE_PAYLOAD_KEYS are configured")
        try:
            text = cipher.decrypt(text[len(ENCRYPTED_PREFIX):].encode()).decode()
        except InvalidToken:
            raise Undecodable("payload does not decrypt with the configured keys") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Undecodable(f"invalid JSON: {exc}") from None


def decode(text: str, *, column: str = "payload", row: str = "?"):
    """Decode a stored payload; an undecodable one reads as None and is reported once per row."""
    try:
        return decode_strict(text)
    except Undecodable as exc:
        key = (column, row)
        with _lock:
            first = key not in _reported
            if first:
                _reported.add(key)
        if first:
            try:
                _reporter(CorruptPayload(column=column, row=row, message=str(exc)))
            except Exception:  # a broken reporter must not break reads
                logger.exception("durable: the corrupt-payload reporter failed")
        return None
