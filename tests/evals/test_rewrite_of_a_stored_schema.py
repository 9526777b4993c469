"""Review of 5642269: a version stored before its inputSchema was checked as it is written (371c8fd), with a
schema that check now refuses, and the writes derived from it: a rewrite proposed from its eval run."""

import pytest

from evals.models import GoldenResult
from tests.builders import graph, node
from workflows.models import WorkflowVersion
from workflows.services import workflow_create, workflow_version_create

pytestmark = pytest.mark.django_db

RUNS = "/api/eval-runs/"
UNUSABLE = {"type": "strng"}  # what 371c8fd refuses; stored before it, it checked no input


def stored_before_the_check(workspace, name="solo"):
    """A version as an installation upgraded to 371c8fd holds it: its inputSchema not a usable JSON Schema."""
    workflow = workflow_create(workspace=workspace, name=name)
    version, _ = workflow_version_create(workflow=workflow, dsl=graph("a", node("a", prompt="Answer.")))
    WorkflowVersion.objects.filter(pk=version.pk).update(dsl={**version.dsl, "inputSchema": UNUSABLE},
                                                         input_schema=UNUSABLE)
    version.refresh_from_db()
    return version


def test_a_rewrite_of_a_version_stored_with_an_unusable_schema_is_not_a_500(api_as, owner, workspace, support_set,
                                                                            evaluate, settings):
    # the rewrite copies the version's DSL, inputSchema included, into workflow_version_create, which now raises
    # DslError: a ValueError outside config.errors, so the API's handler answers 500 (the admin's Propose
    # rewrite catches ValueError and says why)
    settings.DURABLE_DISPATCH_ENABLED = False
    version = stored_before_the_check(workspace)
    run = evaluate(support_set, version)
    assert run.status == "completed" and GoldenResult.objects.filter(eval_run=run, passed=False).exists()
    client = api_as(owner)
    client.raise_request_exception = False
    response = client.post(f"{RUNS}{run.pk}/rewrite/")
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])
    if response.status_code == 400:
        assert "inputSchema" in response.json()["error"]["message"], response.json()
