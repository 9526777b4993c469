import pytest

import tests.durable.workflows  # noqa: F401 - registers the test workflows


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings, request):
    """In-process tests drive runs with run_until_settled; tests with real workers opt back in."""
    if "worker" not in request.keywords:
        settings.DURABLE_DISPATCH_ENABLED = False


@pytest.fixture
def sent_turns(monkeypatch):
    """The run ids turn messages are sent for, from now on."""
    from durable import store

    sent: list[str] = []
    monkeypatch.setattr(store, "dispatch_turn", lambda run_id, priority=0: sent.append(run_id))
    return sent
