from urllib.parse import urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.schema import assert_error_shape
from tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from workspaces.models import Membership, Workspace

pytestmark = pytest.mark.django_db


def test_anonymous_requests_are_refused(api, workspace):
    response = api.get("/api/workspaces/")
    assert response.status_code in (401, 403)
    assert "message" in response.json()["error"]


def test_member_lists_only_their_workspaces(api_as, member, outsider, workspace, other_workspace):
    response = api_as(member).get("/api/workspaces/")
    assert response.status_code == 200
    assert [row["slug"] for row in response.json()["results"]] == ["acme"]
    assert response.json()["results"][0]["role"] == "member"


def test_foreign_workspace_is_404_not_403(api_as, outsider, workspace):
    client = api_as(outsider)
    assert client.get(f"/api/workspaces/{workspace.pk}/").status_code == 404
    assert client.patch(f"/api/workspaces/{workspace.pk}/", {"name": "Mine"}).status_code == 404
    assert client.delete(f"/api/workspaces/{workspace.pk}/").status_code == 404
    assert Workspace.objects.get(pk=workspace.pk).name == "Acme"


def test_foreign_memberships_are_invisible(api_as, outsider, member, workspace):
    client = api_as(outsider)
    membership = Membership.objects.get(user=member)
    assert client.get(f"/api/memberships/{membership.pk}/").status_code == 404
    listed = client.get("/api/memberships/").json()["results"]
    assert {row["workspace"] for row in listed} == {outsider.memberships.get().workspace_id}


def test_creating_a_workspace_makes_the_caller_its_owner(api_as, outsider):
    response = api_as(outsider).post("/api/workspaces/", {"name": "New Lab"})
    assert response.status_code == 201, response.json()
    assert response.json()["slug"] == "new-lab"
    assert response.json()["role"] == "owner"
    assert Membership.objects.get(workspace__slug="new-lab").user == outsider


def test_member_cannot_rename_but_owner_can(api_as, owner, member, workspace):
    assert api_as(member).patch(f"/api/workspaces/{workspace.pk}/", {"name": "X"}).status_code == 403
    assert api_as(owner).patch(f"/api/workspaces/{workspace.pk}/", {"name": "Acme Labs"}).status_code == 200
    assert Workspace.objects.get(pk=workspace.pk).name == "Acme Labs"


def test_validation_error_names_the_field(api_as, owner):
    response = api_as(owner).post("/api/workspaces/", {"slug": "bad slug!"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert set(error["fields"]) == {"name", "slug"}
    assert "name:" in error["message"]


def test_owner_manages_members_and_keeps_one_owner(api_as, owner, member, workspace):
    client = api_as(owner)
    newcomer = UserFactory(username="newcomer")
    response = client.post("/api/memberships/", {"workspace": workspace.pk, "user": "newcomer", "role": "admin"})
    assert response.status_code == 201, response.json()
    assert Membership.objects.get(user=newcomer).role == "admin"

    duplicate = client.post("/api/memberships/", {"workspace": workspace.pk, "user": "newcomer"})
    assert duplicate.status_code == 400
    assert "user" in duplicate.json()["error"]["fields"]

    own = Membership.objects.get(user=owner)
    response = client.patch(f"/api/memberships/{own.pk}/", {"role": "member"})
    assert response.status_code == 400
    assert "at least one owner" in response.json()["error"]["message"]
    assert client.delete(f"/api/memberships/{own.pk}/").status_code == 400


def test_member_cannot_add_members(api_as, member, workspace):
    UserFactory(username="friend")
    response = api_as(member).post("/api/memberships/", {"workspace": workspace.pk, "user": "friend"})
    assert response.status_code == 403


def test_cannot_attach_a_row_to_a_foreign_workspace(api_as, outsider, workspace):
    UserFactory(username="friend")
    response = api_as(outsider).post("/api/memberships/", {"workspace": workspace.pk, "user": "friend"})
    assert response.status_code == 400
    assert "workspace" in response.json()["error"]["fields"]


def test_bad_query_parameters_are_400(api_as, member):
    client = api_as(member)
    for query in ("cursor=not-a-cursor", "page_size=abc", "role=wizard"):
        response = client.get(f"/api/memberships/?{query}")
        assert response.status_code == 400, query
        assert response.json()["error"]["message"]


def test_cursor_pagination_walks_every_row(api_as, owner):
    for index in range(7):
        MembershipFactory(user=owner, workspace=WorkspaceFactory(slug=f"ws-{index}"))
    client = api_as(owner)
    seen, url = [], "/api/workspaces/?page_size=3"
    while url:
        page = client.get(url).json()
        seen.extend(row["slug"] for row in page["results"])
        url = page["next"]
    assert len(seen) == 8 and len(set(seen)) == 8


def _count_queries(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured)


@pytest.mark.parametrize("url", ["/api/workspaces/", "/api/memberships/"])
def test_list_query_count_is_the_same_for_1_and_50_rows(api_as, owner, url):
    client = api_as(owner)
    single = _count_queries(client, url)
    for index in range(49):
        MembershipFactory(user=owner, workspace=WorkspaceFactory(slug=f"many-{index}"))
    assert _count_queries(client, url) == single
    assert single <= 4


def test_token_authentication(api, owner):
    from knox.models import AuthToken

    response = api.post("/api/auth/token/", {"username": "owner", "password": "correct horse battery staple"})
    assert response.status_code == 200
    token = response.json()["token"]
    assert response.json()["expiry"]
    stored = AuthToken.objects.get(user=owner)
    assert token not in (stored.digest, stored.token_key)  # only a hash and a short lookup prefix are kept
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/workspaces/").status_code == 200
    assert api.post("/api/auth/logout/").status_code == 204
    assert api.get("/api/workspaces/").status_code == 401


def test_wrong_password_gets_no_token(api, owner):
    response = api.post("/api/auth/token/", {"username": "owner", "password": "wrong"})
    assert response.status_code == 400
    assert "Unable to log in" in response.json()["error"]["message"]


def test_password_guessing_on_the_token_endpoint_gets_429_with_retry_after(api, owner, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "login": "3/minute"}}
    for _ in range(3):
        assert api.post("/api/auth/token/", {"username": "owner", "password": "wrong"}).status_code == 400
    response = api.post("/api/auth/token/", {"username": "owner", "password": "correct horse battery staple"})
    error = assert_error_shape(response, status=429)
    assert error["code"] == "throttled" and "throttled" in error["message"]
    assert 0 < int(response["Retry-After"]) <= 60
    # another address is counted apart
    other = api.post("/api/auth/token/", {"username": "owner", "password": "correct horse battery staple"},
                     REMOTE_ADDR="192.0.2.7")
    assert other.status_code == 200


def test_writes_are_limited_per_user_and_reads_are_not(api_as, owner, member, workspace, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "write": "2/hour"}}
    client = api_as(owner)
    for index in range(2):
        assert client.post("/api/workspaces/", {"name": f"W{index}", "slug": f"w-{index}"}).status_code == 201
    response = client.post("/api/workspaces/", {"name": "W2", "slug": "w-2"})
    assert_error_shape(response, status=429)
    assert int(response["Retry-After"]) > 60
    assert client.get("/api/workspaces/").status_code == 200
    assert api_as(member).post("/api/workspaces/", {"name": "M", "slug": "m"}).status_code == 201


def test_openapi_schema_and_docs(api_as, owner):
    client = api_as(owner)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/workspaces/" in schema.json()["paths"]
    assert client.get("/api/docs/").status_code == 200


def test_an_oversized_body_is_a_json_413(api_as, owner, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = api_as(owner).post("/api/workspaces/", {"name": "x" * 5000}, format="json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert "file upload" in response.json()["error"]["message"]


def test_a_slug_is_derived_unique_even_from_a_name_without_letters(api_as, owner):
    client = api_as(owner)
    slugs = [client.post("/api/workspaces/", {"name": name}).json()["slug"] for name in ("µ!", "!!!", "Acme", "acme")]
    assert slugs == ["workspace", "workspace-2", "acme-2", "acme-3"]  # "acme" is the fixture's


def test_the_api_root_lists_every_resource_of_every_app(api_as, owner):
    from tests.api.schema import collections

    response = api_as(owner).get("/api/")
    assert response.status_code == 200
    paths = {urlsplit(url).path for url in response.json().values()}
    assert set(collections()) <= paths
    assert {"/api/workspaces/", "/api/durable/events/", "/api/knowledge/search/", "/api/mcp/servers/",
            "/api/mcp/tools/", "/api/mcp/configs/", "/api/evolution-runs/"} <= paths
    assert api_as(owner).get("/api/", {"format": "api"}).status_code == 200


@pytest.mark.parametrize("query", ["search=a%00b", "role=%00", "cursor=%00", "name%00=x"])
def test_a_nul_character_in_the_query_string_is_a_400_naming_the_parameter(api_as, member, query):
    """Postgres cannot hold or compare a NUL character: a query string carrying one is refused before any
    view runs, naming the parameter, never a 500."""
    response = api_as(member).get(f"/api/memberships/?{query}")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "Null characters" in error["message"] and error["fields"]
