"""The knowledge API: sources, search and skills, scoped to the caller's workspaces."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext

from knowledge.models import KnowledgeSource, Skill
from tests.factories import KnowledgeChunkFactory, KnowledgeSourceFactory, SkillFactory
from tests.knowledge.fixtures import make_docx
from tests.knowledge.test_skills import SKILL

pytestmark = pytest.mark.django_db

SOURCES = "/api/knowledge/sources/"
SEARCH = "/api/knowledge/search/"
SKILLS = "/api/knowledge/skills/"


def _count(client, url):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.json()
    return len(queries)


def test_create_a_text_source_and_watch_it_get_indexed(api_as, owner, workspace, ingest):
    client = api_as(owner)
    response = client.post(SOURCES, {"workspace": workspace.pk, "text": "Leases are renewed at half their length.",
                                     "title": "Leases"})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["created"] is True and body["ingest_status"] == "processing" and body["ingest_run"]
    source, _ = ingest(KnowledgeSource.objects.get(pk=body["id"]))
    detail = client.get(f"{SOURCES}{source.pk}/").json()
    assert detail["ingest_status"] == "indexed" and detail["ingest_run_status"] == "completed"
    assert detail["chunks"][0]["content"] == "Leases are renewed at half their length."
    again = client.post(SOURCES, {"workspace": workspace.pk, "text": "Leases are renewed at half their length."})
    assert again.status_code == 200 and again.json()["id"] == source.pk and again.json()["created"] is False


def test_upload_a_file(api_as, owner, workspace, ingest):
    upload = SimpleUploadedFile("guide.docx", make_docx(["Schedules fire once per window."]))
    response = api_as(owner).post(SOURCES, {"workspace": workspace.pk, "file": upload}, format="multipart")
    assert response.status_code == 201, response.json()
    assert response.json()["kind"] == "file" and response.json()["title"] == "guide"
    source, _ = ingest(KnowledgeSource.objects.get(pk=response.json()["id"]))
    assert source.ingest_status == "indexed"


def test_upload_limits_and_formats_name_the_field(api_as, owner, workspace, settings):
    client = api_as(owner)
    settings.KNOWLEDGE_UPLOAD_MAX_BYTES = 2048
    big = client.post(SOURCES, {"workspace": workspace.pk, "file": SimpleUploadedFile("big.txt", b"x" * 4096)},
                      format="multipart")
    assert big.status_code == 400 and "over the 2,048-byte limit" in big.json()["error"]["fields"]["file"][0]
    image = client.post(SOURCES, {"workspace": workspace.pk, "file": SimpleUploadedFile("a.png", b"\x89PNG")},
                        format="multipart")
    assert image.status_code == 400 and "unsupported format" in image.json()["error"]["fields"]["file"][0]


@pytest.mark.parametrize(("payload", "field", "message"), [
    ({}, "text", "Give one of text, url or file."),
    ({"text": "a", "url": "https://example.com/"}, "url", "Give only one"),
    ({"url": "ftp://example.com/"}, "url", "only http and https"),
    ({"url": "http://127.0.0.1:8000/admin/"}, "url", "not a public address"),
    ({"url": "http://localhost/"}, "url", "not a public host"),
    ({"text": "   "}, "text", "empty"),
    ({"text": "abc", "chunk_size": 10}, "chunk_size", "greater than or equal to 200"),
    ({"text": "abc", "chunk_size": 400, "chunk_overlap": 300}, "chunk_overlap", "half the chunk size"),
    ({"text": "abc", "workspace": 999999}, "workspace", "does not exist"),
])
def test_bad_source_input_is_400_naming_the_field(api_as, owner, workspace, payload, field, message):
    body = {"workspace": workspace.pk, **payload}
    response = api_as(owner).post(SOURCES, body)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert field in error["fields"], error
    assert message in " ".join(error["fields"][field])


def test_sources_of_another_workspace_are_404(api_as, outsider, workspace):
    source = KnowledgeSourceFactory(workspace=workspace)
    client = api_as(outsider)
    assert client.get(f"{SOURCES}{source.pk}/").status_code == 404
    assert client.delete(f"{SOURCES}{source.pk}/").status_code == 404
    assert client.post(f"{SOURCES}{source.pk}/reingest/").status_code == 404
    assert client.get(SOURCES).json()["results"] == []
    assert client.post(SOURCES, {"workspace": workspace.pk, "text": "x"}).status_code == 400  # not their workspace


def test_reingest_reembed_delete_and_conflict(api_as, owner, workspace, ingest):
    client = api_as(owner)
    created = client.post(SOURCES, {"workspace": workspace.pk, "text": "Some text about retention."}).json()
    busy = client.post(f"{SOURCES}{created['id']}/reingest/", {"force": True})
    assert busy.status_code == 409 and "being ingested already" in busy.json()["error"]["message"]
    ingest(KnowledgeSource.objects.get(pk=created["id"]))
    again = client.post(f"{SOURCES}{created['id']}/reingest/", {})
    assert again.status_code == 202 and again.json()["ingest_status"] == "processing"
    ingest(KnowledgeSource.objects.get(pk=created["id"]))
    assert client.post(f"{SOURCES}{created['id']}/reembed/").status_code == 202
    ingest(KnowledgeSource.objects.get(pk=created["id"]))
    workspace_wide = client.post(f"{SOURCES}reembed/", {"workspace": workspace.pk, "all": True})
    assert workspace_wide.status_code == 202 and workspace_wide.json()["started"] == 1
    ingest(KnowledgeSource.objects.get(pk=created["id"]))
    assert client.delete(f"{SOURCES}{created['id']}/").status_code == 204
    assert not KnowledgeSource.objects.exists()


def test_source_filters_and_bad_filter_values(api_as, owner, workspace):
    KnowledgeSourceFactory(workspace=workspace, title="Alpha handbook", ingest_status="failed")
    KnowledgeSourceFactory(workspace=workspace, title="Beta notes")
    client = api_as(owner)
    assert [r["title"] for r in client.get(SOURCES, {"ingest_status": "failed"}).json()["results"]] == \
        ["Alpha handbook"]
    assert [r["title"] for r in client.get(SOURCES, {"q": "beta"}).json()["results"]] == ["Beta notes"]
    bad = client.get(SOURCES, {"ingest_status": "bogus", "workspace": "x"})
    assert bad.status_code == 400 and {"ingest_status", "workspace"} <= set(bad.json()["error"]["fields"])
    assert client.get(SOURCES, {"cursor": "garbage"}).status_code == 400


def test_chunks_are_paginated_in_order(api_as, owner, workspace):
    source = KnowledgeSourceFactory(workspace=workspace)
    for i in range(5):
        KnowledgeChunkFactory(source=source, ordinal=i, content=f"chunk {i}")
    page = api_as(owner).get(f"{SOURCES}{source.pk}/chunks/", {"page_size": 2}).json()
    assert [c["ordinal"] for c in page["results"]] == [0, 1] and page["next"]
    nxt = api_as(owner).get(page["next"]).json()
    assert [c["ordinal"] for c in nxt["results"]] == [2, 3]


def test_search_endpoint(api_as, owner, outsider, workspace):
    source = KnowledgeSourceFactory(workspace=workspace, title="Engine", chunk_count=2)
    KnowledgeChunkFactory(source=source, ordinal=0, content="After a crash the run is replayed from checkpoints.")
    KnowledgeChunkFactory(source=source, ordinal=1, content="Bake the cake for forty minutes.")
    client = api_as(owner)
    response = client.post(SEARCH, {"workspace": workspace.pk, "query": "crash replay", "k": 1})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["mode"] == "hybrid" and body["plan"] == "exact"
    assert body["hits"][0]["source_title"] == "Engine" and body["hits"][0]["content"].startswith("After a crash")
    got = client.get(SEARCH, {"workspace": workspace.pk, "query": "cake", "mode": "fulltext",
                              "sources": str(source.pk)})
    assert got.status_code == 200 and got.json()["hits"][0]["ordinal"] == 1
    foreign = api_as(outsider).post(SEARCH, {"workspace": workspace.pk, "query": "crash"})
    assert foreign.status_code == 400 and "workspace" in foreign.json()["error"]["fields"]


@pytest.mark.parametrize(("params", "field"), [
    ({"query": ""}, "query"), ({"query": "x", "mode": "fuzzy"}, "mode"), ({"query": "x", "k": 0}, "k"),
    ({"query": "x", "k": "many"}, "k"), ({"query": "x", "sources": "a,b"}, "sources"),
    ({"query": "x", "sources": "99999"}, "sources"), ({"query": "x" * 3000}, "query"),
])
def test_bad_search_parameters_are_400(api_as, owner, workspace, params, field):
    response = api_as(owner).get(SEARCH, {"workspace": workspace.pk, **params})
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]


def test_skills_create_versions_activate_and_match(api_as, owner, workspace):
    client = api_as(owner)
    first = client.post(SKILLS, {"workspace": workspace.pk, "content": SKILL})
    assert first.status_code == 201 and first.json()["outcome"] == "created"
    assert first.json()["skill_md"].startswith("---\n")
    same = client.post(SKILLS, {"workspace": workspace.pk, "content": SKILL})
    assert same.status_code == 200 and same.json()["outcome"] == "skipped"
    second = client.post(SKILLS, {"workspace": workspace.pk, "content": SKILL.replace("carefully", "twice")})
    assert second.status_code == 201 and second.json()["version"] == 2
    versions = client.get(f"{SKILLS}{first.json()['id']}/versions/").json()
    assert [(v["version"], v["active"]) for v in versions] == [(2, True), (1, False)]
    assert client.post(f"{SKILLS}{first.json()['id']}/activate/").json()["active"] is True
    assert [s["version"] for s in client.get(SKILLS, {"active": "true"}).json()["results"]] == [1]
    matched = client.get(f"{SKILLS}match/", {"workspace": workspace.pk, "q": "look at this stack trace"}).json()
    assert [(m["name"], m["reason"]) for m in matched] == [("bug-triage", "trigger: stack trace")]
    bad = client.post(SKILLS, {"workspace": workspace.pk, "content": "no front matter"})
    assert bad.status_code == 400 and "no YAML front matter" in bad.json()["error"]["fields"]["content"][0]


def test_skills_of_another_workspace_are_invisible(api_as, outsider, workspace):
    skill = SkillFactory(workspace=workspace)
    client = api_as(outsider)
    assert client.get(f"{SKILLS}{skill.pk}/").status_code == 404
    assert client.post(f"{SKILLS}{skill.pk}/activate/").status_code == 404
    assert client.get(SKILLS).json()["results"] == []


# ------------------------------------------------------------------------------- query budgets


def _sources(workspace, n):
    KnowledgeSourceFactory.create_batch(n, workspace=workspace)


def _skills(workspace, n):
    for _ in range(n):
        SkillFactory(workspace=workspace)


@pytest.mark.parametrize(("url", "make"), [(SOURCES, _sources), (SKILLS, _skills)])
def test_list_endpoints_cost_the_same_for_1_and_50_rows(api_as, owner, workspace, url, make):
    client = api_as(owner)
    make(workspace, 1)
    one = _count(client, url)
    make(workspace, 49)
    assert len(client.get(url).json()["results"]) == 50
    assert _count(client, url) == one


def test_chunk_list_and_versions_cost_the_same_for_1_and_50_rows(api_as, owner, workspace):
    client = api_as(owner)
    source = KnowledgeSourceFactory(workspace=workspace)
    KnowledgeChunkFactory(source=source, ordinal=0)
    skill = SkillFactory(workspace=workspace, name="versioned", version=1, active=False)
    one_chunk = _count(client, f"{SOURCES}{source.pk}/chunks/")
    one_version = _count(client, f"{SKILLS}{skill.pk}/versions/")
    for i in range(1, 50):
        KnowledgeChunkFactory(source=source, ordinal=i)
        SkillFactory(workspace=workspace, name="versioned", version=i + 1, active=False)
    assert _count(client, f"{SOURCES}{source.pk}/chunks/") == one_chunk
    assert _count(client, f"{SKILLS}{skill.pk}/versions/") == one_version
    assert Skill.objects.filter(name="versioned").count() == 50


def test_openapi_schema_documents_the_knowledge_endpoints(api_as, owner):
    schema = api_as(owner).get("/api/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert {"/api/knowledge/sources/", "/api/knowledge/search/", "/api/knowledge/skills/match/"} <= set(paths)
