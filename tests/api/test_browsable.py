"""The browsable API (`?format=api`) renders forms: a create form with the serializer's related fields
and the filter form. Their select boxes may list only what the caller may see."""

import pytest

from tests.factories import KnowledgeSourceFactory, SkillFactory, UserFactory

pytestmark = pytest.mark.django_db

PAGES = ["/api/memberships/", "/api/knowledge/sources/", "/api/knowledge/skills/", "/api/durable/runs/",
         "/api/durable/schedules/", "/api/durable/events/", "/api/workspaces/", "/api/knowledge/search/"]


@pytest.fixture
def strangers(other_workspace, outsider):
    """Another workspace with a distinctive name, and a user who shares no workspace with the owner."""
    other_workspace.name = "Globex Secret Labs"
    other_workspace.save()
    UserFactory(username="stranger-danger")
    KnowledgeSourceFactory(workspace=other_workspace, title="Globex plans")
    SkillFactory(workspace=other_workspace, name="globex-skill")
    return other_workspace


@pytest.mark.parametrize("url", PAGES)
def test_forms_list_nothing_of_other_workspaces_or_users(api_as, owner, workspace, strangers, url):
    response = api_as(owner).get(url, {"format": "api"})
    assert response.status_code in (200, 400, 405), url  # search without a query: 400; events: POST only
    html = response.content.decode()
    for secret in ("Globex Secret Labs", "stranger-danger", "outsider", "globex-skill", "Globex plans"):
        assert secret not in html, (url, secret)
    assert "Acme" in html or url in ("/api/knowledge/search/",)  # the caller's own workspace is offered


@pytest.mark.parametrize("url", ["/api/memberships/", "/api/knowledge/sources/", "/api/knowledge/skills/",
                                 "/api/durable/runs/", "/api/durable/schedules/"])
def test_a_workspace_filter_answers_the_same_for_a_foreign_and_a_missing_id(api_as, owner, workspace,
                                                                           other_workspace, url):
    client = api_as(owner)
    foreign = client.get(url, {"workspace": other_workspace.pk})
    missing = client.get(url, {"workspace": 987654})
    assert foreign.status_code == missing.status_code == 400, (url, foreign.status_code, missing.status_code)
    assert list(foreign.json()["error"]["fields"]) == list(missing.json()["error"]["fields"]) == ["workspace"]
    assert foreign.json()["error"]["message"].replace(str(other_workspace.pk), "N") == \
        missing.json()["error"]["message"].replace("987654", "N")
    assert client.get(url, {"workspace": workspace.pk}).status_code == 200
