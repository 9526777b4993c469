"""Review of 5642269: a version stored before its inputSchema was checked as it is written (371c8fd), with a
schema that check now refuses, and the writes derived from it: a rewrite proposed from its eval run."""

import pytest

from evals.models import GoldenResult

pytestmark = pytest.mark.django_db

RUNS = "/api/eval-runs/"


def test_a_rewrite_of_a_version_stored_with_an_unusable_schema_is_a_400_naming_it(
        api_as, owner, support_set, evaluate, settings, version_stored_with_an_unusable_schema):
    # the rewrite copies the version's DSL, inputSchema included, into workflow_version_create, which raises
    # DslError: before it was an Invalid, the API's handler answered 500 (the admin's Propose rewrite catches
    # ValueError and says why)
    settings.DURABLE_DISPATCH_ENABLED = False
    version = version_stored_with_an_unusable_schema
    run = evaluate(support_set, version)
    assert run.status == "completed" and GoldenResult.objects.filter(eval_run=run, passed=False).exists()
    client = api_as(owner)
    client.raise_request_exception = False
    response = client.post(f"{RUNS}{run.pk}/rewrite/")
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert "inputSchema" in response.json()["error"]["message"], response.json()
