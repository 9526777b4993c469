"""The llm tests' `openai_server`: a local OpenAI-compatible server (tests/openai_server.py)."""

import pytest

from tests.openai_server import FakeOpenAIChat


@pytest.fixture
def openai_server():
    with FakeOpenAIChat(dimensions=384) as server:
        yield server
