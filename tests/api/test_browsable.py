"""The browsable API (`?format=api`) renders forms: a create form with the serializer's related fields
and the filter form. Their select boxes may list only what the caller may see."""

import re

import pytest

from tests.api.schema import operations
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


def _required_query(op, workspace) -> dict:
    """Values for an operation's required query parameters: the caller's workspace, a text found in the world."""
    required = [p["name"] for p in op.spec.get("parameters", []) if p.get("in") == "query" and p.get("required")]
    return {name: workspace.pk if name == "workspace" else "durable" for name in required}


def test_every_get_endpoint_renders_as_the_browsable_api(api_as, owner, workspace, world, object_ids):
    """Each GET answers its page with the forms the renderer draws for it (a non-model answer, a search
    result, included), never a 500 (compare and diff without their versions: 400)."""
    ids = object_ids(owner)
    client = api_as(owner)
    problems = []
    for op in operations(method="get"):
        url = op.url(ids[op.collection]) if op.is_detail else op.path
        response = client.get(url, {"format": "api", **_required_query(op, workspace)})
        if response.status_code not in (200, 400) or not response["Content-Type"].startswith("text/html"):
            problems.append(f"{op}: {response.status_code}")
    assert problems == []
    page = client.get("/api/knowledge/search/", {"format": "api", "workspace": workspace.pk, "query": "durable"})
    assert world["mine"] in page.content.decode()


def test_the_browsable_api_and_the_admin_link_to_each_others_page_of_a_row(api_as, owner, workspace, make_version):
    from django.urls import reverse

    from tests.admin_users import admin_staff, client_of
    from tests.builders import graph, node

    version = make_version(graph("a", node("a", prompt="Hi.")))
    api_page = f"/api/workflow-versions/{version.pk}/"
    admin_page = reverse("admin:workflows_workflowversion_change", args=[version.pk])
    # a member who is not staff: no admin to go to
    html = api_as(owner).get(api_page, {"format": "api"}).content.decode()
    assert 'id="api-admin-link"' not in html
    staff = admin_staff("operator", workspace, apps=["workflows"])
    html = api_as(staff).get(api_page, {"format": "api"}).content.decode()
    assert f'<a href="{admin_page}" id="api-admin-link">Open in admin</a>' in html
    listing = api_as(staff).get("/api/workflow-versions/", {"format": "api"}).content.decode()
    assert f'<a href="{reverse("admin:workflows_workflowversion_changelist")}" id="api-admin-link">' in listing
    html = client_of(staff).get(admin_page).content.decode()
    assert f'<a href="{api_page}" id="admin-api-link">View in API</a>' in html


def test_the_links_between_the_api_and_the_admin_open_a_run_whose_id_the_admin_escapes(api_as, workspace):
    import tests.durable.workflows  # noqa: F401 - registers tests.signal
    from durable.services import caller_run_id, run_start
    from tests.admin_users import admin_staff, client_of

    # a caller-chosen id, stored with its namespace; unescaped, the admin would read its "_2F" as a "/"
    run = run_start(workflow="tests.signal", input={}, namespace=workspace.namespace,
                    run_id=caller_run_id(namespace=workspace.namespace, run_id="nightly_2F1"))
    staff = admin_staff("operator", workspace, apps=["durable"])
    html = api_as(staff).get(f"/api/durable/runs/{run.pk}/", {"format": "api"}).content.decode()
    (admin_page,) = re.findall(r'<a href="([^"]+)" id="api-admin-link">', html)
    page = client_of(staff).get(admin_page)
    assert page.status_code == 200 and page.context["original"].pk == run.pk
    (api_page,) = re.findall(r'<a href="([^"]+)" id="admin-api-link">', page.content.decode())
    assert api_as(staff).get(api_page).json()["id"] == run.pk
