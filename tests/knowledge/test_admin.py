import pytest
from django.test import Client
from django.urls import reverse

from knowledge import services
from knowledge.models import KnowledgeSource, Skill
from tests.factories import KnowledgeChunkFactory, KnowledgeSourceFactory, UserFactory
from tests.knowledge.test_skills import SKILL

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(db):
    client = Client()
    client.force_login(UserFactory(username="root", is_superuser=True, is_staff=True))
    return client


def test_source_pages_and_search_box(admin_client, workspace):
    source = KnowledgeSourceFactory(workspace=workspace, title="Engine handbook", chunk_count=1)
    KnowledgeChunkFactory(source=source, ordinal=0)
    changelist = admin_client.get(reverse("admin:knowledge_knowledgesource_changelist"), {"q": "engine",
                                                                                          "ingest_status": "indexed"})
    assert changelist.status_code == 200 and b"Engine handbook" in changelist.content
    by_content = admin_client.get(reverse("admin:knowledge_knowledgesource_changelist"), {"q": "durable workflows"})
    assert b"Engine handbook" in by_content.content  # found through its chunk's words
    nothing = admin_client.get(reverse("admin:knowledge_knowledgesource_changelist"), {"q": "zebra"})
    assert b"Engine handbook" not in nothing.content
    assert admin_client.get(reverse("admin:knowledge_knowledgesource_change", args=[source.pk])).status_code == 200
    assert admin_client.get(reverse("admin:knowledge_knowledgesource_add")).status_code == 200
    chunks = admin_client.get(reverse("admin:knowledge_knowledgechunk_changelist"), {"source__id__exact": source.pk})
    assert chunks.status_code == 200
    chunk = source.chunks.get()
    page = admin_client.get(reverse("admin:knowledge_knowledgechunk_change", args=[chunk.pk]))
    assert page.status_code == 200 and b"Save" not in page.content  # read-only


def test_add_a_text_source_in_the_admin(admin_client, workspace, ingest):
    response = admin_client.post(reverse("admin:knowledge_knowledgesource_add"), {
        "workspace": workspace.pk, "title": "Pasted", "text": "Text pasted into the admin.",
    })
    assert response.status_code == 302
    source = KnowledgeSource.objects.get(title="Pasted")
    source, _ = ingest(source)
    assert source.ingest_status == "indexed"


def test_reingest_action_starts_runs_and_skips_busy_sources(admin_client, workspace, ingest):
    done, _ = services.source_create_text(workspace=workspace, text="Indexed already.")
    ingest(done)
    busy, _ = services.source_create_text(workspace=workspace, text="Still processing.")
    response = admin_client.post(reverse("admin:knowledge_knowledgesource_changelist"), {
        "action": "reingest_force", "_selected_action": [done.pk, busy.pk],
    }, follow=True)
    text = response.content.decode()
    assert "Started 1 ingest run(s)." in text and "1 source(s) were being ingested already" in text
    done.refresh_from_db()
    assert done.ingest_status == "processing"


def test_skill_history_and_diff_against_the_active_version(admin_client, workspace):
    first, _ = services.skill_create_from_text(workspace=workspace, content=SKILL)
    second, _ = services.skill_create_from_text(workspace=workspace, content=SKILL.replace("carefully", "twice"))
    page = admin_client.get(reverse("admin:knowledge_skill_change", args=[first.pk])).content.decode()
    assert "v2 (active)" in page and "-Read the report twice." in page and "+Read the report carefully." in page
    assert f'href="{reverse("admin:knowledge_skill_change", args=[second.pk])}"' in page
    response = admin_client.post(reverse("admin:knowledge_skill_changelist"), {
        "action": "activate_versions", "_selected_action": [first.pk]}, follow=True)
    assert "Activated 1 version(s)" in response.content.decode()
    assert Skill.objects.get(active=True).pk == first.pk


def test_add_a_skill_in_the_admin(admin_client, workspace):
    url = reverse("admin:knowledge_skill_add")
    bad = admin_client.post(url, {"workspace": workspace.pk, "skill_md": "no front matter", "make_active": "on"})
    assert bad.status_code == 200 and "no YAML front matter" in bad.content.decode()
    good = admin_client.post(url, {"workspace": workspace.pk, "skill_md": SKILL, "make_active": "on"})
    assert good.status_code == 302
    assert Skill.objects.get().origin == "admin"
