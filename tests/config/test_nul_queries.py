"""A NUL character in a query string is bad input like any other: Postgres can neither store nor compare one, so
every admin changelist and every API list answers 400 (or shows its own error), never a 500."""

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import reverse

pytestmark = pytest.mark.django_db

CHANGELISTS = sorted(f"admin:{m._meta.app_label}_{m._meta.model_name}_changelist" for m in admin.site._registry)
QUERIES = ["q=a%00b", "o=%00", "p=%00", "id__exact=%00", "workspace__id__exact=%00", "status__exact=%00",
           "created_at__gte=%00", "e=%00"]


@pytest.fixture
def superuser_client(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


@pytest.mark.parametrize("name", CHANGELISTS)
def test_no_admin_changelist_answers_a_nul_with_a_500(superuser_client, name):
    for query in QUERIES:
        response = superuser_client.get(f"{reverse(name)}?{query}")
        assert response.status_code < 500, (name, query)


def _api_lists() -> list[str]:
    from config.urls import api_patterns

    names = []
    for pattern in api_patterns:
        for entry in getattr(pattern, "url_patterns", []):
            name = getattr(entry, "name", "") or ""
            if name.endswith("-list"):
                names.append(name)
    return sorted(set(names))


@pytest.mark.parametrize("name", _api_lists())
def test_no_api_list_answers_a_nul_with_a_500(superuser_client, name):
    for query in ["search=a%00b", "ordering=%00", "cursor=%00", "status=%00", "workspace=%00", "since=%00",
                  "q=%00", "name=%00", "id=%00"]:
        response = superuser_client.get(f"{reverse(name)}?{query}")
        assert response.status_code < 500, (name, query)


def test_the_admins_refusal_names_the_parameter(superuser_client):
    response = superuser_client.get(reverse("admin:durable_durablerun_changelist") + "?q=a%00b")
    assert response.status_code == 400 and response.content.decode().startswith("q: Null characters")
    response = superuser_client.get(reverse("admin:durable_durablerun_change", args=[quote("run\x00")]))
    assert response.status_code == 400 and b"object_id" in response.content
