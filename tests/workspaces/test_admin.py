"""The admin shows a staff user who is not a superuser nothing of a workspace they are not in:
not in changelists, filters or facet counts, change pages, autocomplete and raw-id lookups, nor in the
choices of forms. Superusers still see everything."""

import re
from datetime import timedelta

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from durable.models import BufferedEvent, BufferedSignal, DurableRun, Schedule
from tests.factories import (
    KnowledgeChunkFactory,
    KnowledgeSourceFactory,
    MembershipFactory,
    SkillFactory,
    UserFactory,
    WorkspaceFactory,
)
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

SECRET = "globex-secret"


@pytest.fixture
def two_workspaces():
    ours = WorkspaceFactory(name="Acme", slug="acme")
    theirs = WorkspaceFactory(name=f"Globex {SECRET}", slug=SECRET)
    rows = {}
    for label, workspace in (("ours", ours), ("theirs", theirs)):
        tag = "acme-visible" if label == "ours" else SECRET
        source = KnowledgeSourceFactory(workspace=workspace, title=f"source {tag}")
        chunk = KnowledgeChunkFactory(source=source, content=f"chunk {tag} about durable workflows")
        skill = SkillFactory(workspace=workspace, name=f"skill-{tag}")
        run = DurableRun.objects.create(id=f"run-{tag}", workflow="tests.sequence", namespace=workspace.namespace,
                                        status="failed")
        schedule = Schedule.objects.create(key=f"sched-{tag}", workflow="tests.sequence",
                                           namespace=workspace.namespace, every_seconds=60)
        signal = BufferedSignal.objects.create(run=run, name=f"signal-{tag}", payload="{}")
        event = BufferedEvent.objects.create(namespace=workspace.namespace, name=f"event-{tag}", payload={},
                                             expires_at=timezone.now() + timedelta(days=1))
        membership = MembershipFactory(workspace=workspace, user=UserFactory(username=f"colleague-{tag}"))
        rows[label] = {"workspace": workspace, "membership": membership, "source": source, "chunk": chunk,
                       "skill": skill, "run": run, "schedule": schedule, "signal": signal, "event": event}
    return rows


@pytest.fixture
def staff(client, two_workspaces):
    """A staff member of Acme only, with every admin permission of these apps but no superuser flag."""
    user = UserFactory(username="staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label__in=["workspaces", "knowledge", "durable"]))
    MembershipFactory(user=user, workspace=two_workspaces["ours"]["workspace"], role=Membership.Role.OWNER)
    client.force_login(user)
    return client


ADMINS = {  # row key -> admin URL name prefix
    "workspace": "workspaces_workspace", "membership": "workspaces_membership",
    "source": "knowledge_knowledgesource", "chunk": "knowledge_knowledgechunk", "skill": "knowledge_skill",
    "run": "durable_durablerun", "schedule": "durable_schedule", "signal": "durable_bufferedsignal",
    "event": "durable_bufferedevent",
}


def change_url(name, obj):
    return reverse(f"admin:{name}_change", args=[quote(obj.pk)])


@pytest.mark.parametrize("key", list(ADMINS))
def test_changelists_list_only_the_users_workspaces(staff, two_workspaces, key):
    name = ADMINS[key]
    for query in ("", "?_facets=True", "?q=globex"):  # the page echoes the term, never the row
        response = staff.get(reverse(f"admin:{name}_changelist") + query)
        assert response.status_code == 200
        listed = {obj.pk for obj in response.context["cl"].result_list}
        assert two_workspaces["theirs"][key].pk not in listed
        assert SECRET not in response.content.decode()
    listed = {obj.pk for obj in staff.get(reverse(f"admin:{name}_changelist")).context["cl"].result_list}
    assert two_workspaces["ours"][key].pk in listed


@pytest.mark.parametrize("key", list(ADMINS))
def test_change_pages_of_another_workspace_do_not_open(staff, two_workspaces, key):
    name = ADMINS[key]
    ours = staff.get(change_url(name, two_workspaces["ours"][key]))
    assert ours.status_code == 200
    theirs = staff.get(change_url(name, two_workspaces["theirs"][key]))
    assert theirs.status_code in (302, 404)
    assert SECRET not in theirs.content.decode()
    if theirs.status_code == 302:
        # the admin's message for a missing row repeats the id from the URL, exactly as for an id that never
        # existed; nothing else of the row may show
        page = re.sub(r"<li class=\"warning\">[^<]*doesn\u2019t exist[^<]*</li>", "",
                      staff.get(theirs.url).content.decode())
        assert SECRET not in page
    delete = staff.get(reverse(f"admin:{name}_delete", args=[quote(two_workspaces["theirs"][key].pk)]))
    assert delete.status_code in (302, 403, 404)
    assert SECRET not in delete.content.decode()


def test_posting_to_another_workspaces_row_changes_nothing(staff, two_workspaces):
    theirs = two_workspaces["theirs"]
    staff.post(change_url("knowledge_knowledgesource", theirs["source"]), {"title": "renamed"})
    theirs["source"].refresh_from_db()
    assert theirs["source"].title == f"source {SECRET}"
    staff.post(reverse("admin:durable_durablerun_changelist"),
               {"action": "cancel_runs", "_selected_action": [theirs["run"].pk, two_workspaces["ours"]["run"].pk]})
    staff.post(reverse("admin:durable_schedule_changelist"),
               {"action": "pause_schedules", "_selected_action": [theirs["schedule"].pk]})
    theirs["schedule"].refresh_from_db()
    assert theirs["schedule"].paused is False


def test_filters_and_facet_counts_name_only_the_users_workspaces(staff, two_workspaces):
    for name in ("durable_durablerun", "durable_schedule", "durable_bufferedevent", "knowledge_knowledgesource",
                 "knowledge_knowledgechunk", "knowledge_skill", "workspaces_membership"):
        page = staff.get(reverse(f"admin:{name}_changelist") + "?_facets=True").content.decode()
        assert SECRET not in page
        assert two_workspaces["theirs"]["workspace"].namespace not in page
    runs = staff.get(reverse("admin:durable_durablerun_changelist") + "?_facets=True")
    assert f"{two_workspaces['ours']['workspace'].namespace}" in runs.content.decode()
    # the status facet counts the user's runs only: one failed run, not two
    assert "Failed (1)" in runs.content.decode()


def test_autocomplete_and_raw_id_lookups_are_scoped(staff, two_workspaces):
    autocomplete = staff.get(reverse("admin:autocomplete"), {
        "app_label": "workspaces", "model_name": "membership", "field_name": "workspace", "term": "",
    })
    assert autocomplete.status_code == 200
    ids = {int(result["id"]) for result in autocomplete.json()["results"]}
    assert ids == {two_workspaces["ours"]["workspace"].pk}
    assert SECRET not in autocomplete.content.decode()
    # the raw-id popup of a source's workspace is the (scoped) workspace changelist
    popup = staff.get(reverse("admin:workspaces_workspace_changelist") + "?_to_field=id&_popup=1")
    assert SECRET not in popup.content.decode()
    assert "Acme" in popup.content.decode()


def test_form_choices_offer_only_the_users_workspaces(staff, two_workspaces):
    theirs = two_workspaces["theirs"]["workspace"]
    for name in ("knowledge_knowledgesource", "knowledge_skill", "workspaces_membership"):
        form = staff.get(reverse(f"admin:{name}_add")).context["adminform"].form
        assert list(form.fields["workspace"].queryset) == [two_workspaces["ours"]["workspace"]]
    schedule_form = staff.get(reverse("admin:durable_schedule_add")).context["adminform"].form
    assert theirs.namespace not in {value for value, _label in schedule_form.fields["namespace"].choices}
    response = staff.post(reverse("admin:durable_schedule_add"), {
        "key": "sneaky", "workflow": "tests.sequence", "namespace": theirs.namespace, "input": "{}",
        "every_seconds": "60", "cron": "", "timezone": "UTC", "overlap": "allow", "jitter_seconds": "0",
        "catchup_limit": "1", "tags": ""})
    assert response.status_code == 200 and "namespace" in response.context["adminform"].form.errors
    assert not Schedule.objects.filter(key="sneaky").exists()
    membership = staff.post(reverse("admin:workspaces_membership_add"), {
        "user": UserFactory(username="newcomer").pk, "workspace": theirs.pk, "role": "member"})
    assert membership.status_code == 200
    assert not Membership.objects.filter(user__username="newcomer").exists()


def test_superusers_still_see_every_workspace(admin_client, two_workspaces):
    for key, name in ADMINS.items():
        response = admin_client.get(reverse(f"admin:{name}_changelist"))
        listed = {obj.pk for obj in response.context["cl"].result_list}
        assert {two_workspaces["ours"][key].pk, two_workspaces["theirs"][key].pk} <= listed, key
        assert admin_client.get(change_url(name, two_workspaces["theirs"][key])).status_code == 200


def test_the_delete_page_of_a_workspace_costs_the_same_queries_for_1_or_5_related_rows(staff, two_workspaces):
    """The confirmation lists every row the delete cascades to and asks the row's admin for its delete
    permission: the scope is the queryset, never a query per listed row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ours = two_workspaces["ours"]["workspace"]
    url = reverse("admin:workspaces_workspace_delete", args=[ours.pk])

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(url).status_code == 200
        return len(captured)

    one = queries()
    for index in range(4):
        SkillFactory(workspace=ours, name=f"more-{index}")
        KnowledgeSourceFactory(workspace=ours, title=f"more {index}")
    assert queries() == one
