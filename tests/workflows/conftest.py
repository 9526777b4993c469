"""Fixtures of the workflows tests (the DSL builders are in tests/builders.py)."""

import pytest


@pytest.fixture
def in_process(settings, tmp_path):
    """Runs driven in-process (run_until_settled), no worker dispatch; blobs in a temporary media root."""
    settings.DURABLE_DISPATCH_ENABLED = False
    settings.MEDIA_ROOT = str(tmp_path / "media")
