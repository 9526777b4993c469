"""Encryption of secrets at rest (provider keys, MCP server credentials).

Keys come from FIELD_ENCRYPTION_KEYS (comma-separated Fernet keys: the first encrypts,
all decrypt, so keys rotate). Without it, one key is derived from SECRET_KEY with HKDF,
which keeps development working with no setup; production should set its own keys.
"""

from __future__ import annotations

import base64
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

PREFIX = "fernet:"


@lru_cache(maxsize=4)
def _cipher(keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    if keys:
        try:
            return MultiFernet([Fernet(key.encode()) for key in keys])
        except (ValueError, TypeError) as exc:
            raise ImproperlyConfigured(f"FIELD_ENCRYPTION_KEYS holds an invalid Fernet key ({exc}).") from None
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"lineage-field-encryption", info=b"v1").derive(
        secret_key.encode()
    )
    return MultiFernet([Fernet(base64.urlsafe_b64encode(derived))])


def cipher() -> MultiFernet:
    return _cipher(tuple(settings.FIELD_ENCRYPTION_KEYS), settings.SECRET_KEY)


def encrypt(plaintext: str) -> str:
    return PREFIX + cipher().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    if not token.startswith(PREFIX):
        raise ValueError("not an encrypted value")
    try:
        return cipher().decrypt(token[len(PREFIX):].encode()).decode()
    except InvalidToken:
        raise ValueError("the value does not decrypt with the configured FIELD_ENCRYPTION_KEYS") from None


class EncryptedTextField(models.TextField):
    """A text column stored encrypted; reads give the plaintext back. Empty stays empty."""

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value in (None, ""):
            return value
        return encrypt(value)

    def from_db_value(self, value, expression, connection):
        if value in (None, ""):
            return value
        return decrypt(value)
