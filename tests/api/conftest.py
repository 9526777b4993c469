import pytest

import tests.durable.workflows  # noqa: F401 - the suites walk every registered workflow, test ones included


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Runs started through the API here are driven in-process (or left pending): no worker listens."""
    settings.DURABLE_DISPATCH_ENABLED = False
