import pytest
from cryptography.fernet import Fernet

from config import crypto


def test_round_trip_with_a_derived_key():
    token = crypto.encrypt("sk-live-123")
    assert token.startswith("fernet:") and "sk-live-123" not in token
    assert crypto.decrypt(token) == "sk-live-123"


def test_key_rotation_keeps_old_values_readable(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEYS = [old]
    token = crypto.encrypt("secret")
    settings.FIELD_ENCRYPTION_KEYS = [new, old]
    assert crypto.decrypt(token) == "secret"
    settings.FIELD_ENCRYPTION_KEYS = [new]
    with pytest.raises(ValueError, match="does not decrypt"):
        crypto.decrypt(token)


def test_the_field_encrypts_what_it_stores():
    field = crypto.EncryptedTextField()
    stored = field.get_prep_value("hunter2")
    assert stored.startswith("fernet:")
    assert field.from_db_value(stored, None, None) == "hunter2"
    assert field.get_prep_value("") == ""
