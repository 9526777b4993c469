import re
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from config.admin import EstimatedCountPaginator
from durable.inprocess import run_until_settled
from durable.models import BufferedEvent, BufferedSignal, DurableRun, Schedule
from durable.services import run_retry, run_start, signal_send
from durable.store import upsert_attributes
from tests.factories import KnowledgeSourceFactory, MembershipFactory, UserFactory, WorkspaceFactory
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:durable_durablerun_changelist")


def change_url(run_id):
    return reverse("admin:durable_durablerun_change", args=[quote(run_id)])


def corrupt_output(run_id):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE durable_durablerun SET output = %s WHERE id = %s", ["{broken", run_id])


def make(run_id, status, workflow="tests.sequence", namespace="default"):
    return DurableRun.objects.create(id=run_id, workflow=workflow, status=status, namespace=namespace)


def test_changelist_lists_filters_and_searches(admin_client):
    run = run_until_settled(run_start(workflow="tests.values", input={"customer": "initech", "amount": 3}).id)
    make("other-run", "failed", workflow="tests.fan", namespace="ws-9")
    page = admin_client.get(CHANGELIST)
    assert page.status_code == 200
    assert run.id in page.content.decode() and "other-run" in page.content.decode()

    def listed(query):
        response = admin_client.get(CHANGELIST + query)
        assert response.status_code == 200
        return {obj.pk for obj in response.context["cl"].result_list}

    assert listed("?status__exact=failed") == {"other-run"}
    assert listed("?workflow=tests.values") == {run.id}
    assert listed("?namespace=ws-9") == {"other-run"}
    assert listed("?q=other-run") == {"other-run"}
    assert listed("?q=initech") == {run.id}
    assert listed("?q=customer%3Dinitech") == {run.id}
    assert listed("?q=customer%3Dnobody") == set()


def test_search_by_run_id_prefix_is_index_served(admin_client):
    """An operator pastes the start of a run id; the changelist finds it through an index, not a scan."""
    make("order-42-a", "completed")
    make("order-42-b", "failed")
    make("invoice-7", "completed")
    make("x-order-42", "completed")  # contains the term, does not start with it

    def listed(query):
        response = admin_client.get(CHANGELIST + query)
        assert response.status_code == 200
        return {obj.pk for obj in response.context["cl"].result_list}

    assert listed("?q=order-42") == {"order-42-a", "order-42-b"}
    assert listed("?q=order-42-a") == {"order-42-a"}
    assert listed("?q=order_42") == set()  # LIKE wildcards in the term are literal
    assert listed("?q=nothing") == set()

    from durable.admin import DurableRunAdmin
    from durable.models import DurableRun as Run

    model_admin = DurableRunAdmin(Run, None)
    queryset, _ = model_admin.get_search_results(None, Run.objects.all(), "order-42")
    assert {run.pk for run in queryset} == {"order-42-a", "order-42-b"}
    # the prefix part of the search is an index range on the pattern operators (~>=~ / ~<~): Django's
    # varchar_pattern_ops index on the id (the join around it is the planner's choice for the table's size,
    # measured at 1,000,000 runs by `python -m bench admin_search`)
    prefix = Run.objects.filter(pk__startswith="order-42").values("pk")
    # enough other runs, with statistics, that a range is clearly the plan (a few rows could be read whole)
    Run.objects.bulk_create(Run(id=f"filler-{index:05d}", workflow="tests.sequence") for index in range(3000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_durablerun")
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql, params = prefix.query.sql_with_params()
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "~>=~" in plan and "Seq Scan" not in plan


def test_runs_are_read_only(admin_client):
    make("ro", "completed")
    assert admin_client.get(reverse("admin:durable_durablerun_add")).status_code == 403
    assert admin_client.get(reverse("admin:durable_durablerun_delete", args=["ro"])).status_code == 403
    response = admin_client.post(change_url("ro"), {"status": "failed"})
    assert response.status_code == 403
    assert DurableRun.objects.get(pk="ro").status == "completed"


def test_run_page_shows_timeline_children_attributes_and_payloads(admin_client):
    run = run_until_settled(run_start(workflow="tests.parent", input={"hello": "world"}).id)
    upsert_attributes(run.id, {"team": "ops", "cost": 2.5})
    response = admin_client.get(change_url(run.id))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="durable-timeline"' in html
    timeline = response.context["timeline"]
    assert [entry.kind for entry in timeline][:2] == ["child", "child"]
    assert all(entry.run_seconds is not None for entry in timeline)  # waits count from their creation
    assert all(entry.queue_seconds is None for entry in timeline if entry.kind == "child")
    assert "queued (s)" in html and "ran (s)" in html
    assert "&quot;hello&quot;: &quot;world&quot;" in html  # pretty JSON input
    assert len(response.context["children"]) == 4
    assert f"{run.id}/0" in html
    attributes = {key: value for key, value, _url in response.context["attributes"]}
    assert attributes == {"cost": 2.5, "team": "ops"}
    child = admin_client.get(change_url(f"{run.id}/0"))
    assert child.status_code == 200 and run.id in child.content.decode()


def test_a_corrupt_payload_never_breaks_the_changelist_or_the_run_page(admin_client):
    run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2}).id)
    corrupt_output(run.id)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE durable_stepcheckpoint SET output = 'enc1:zzz' WHERE run_id = %s AND seq = 1",
                       [run.id])
    assert admin_client.get(CHANGELIST).status_code == 200
    response = admin_client.get(change_url(run.id))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count("(undecodable)") >= 2  # the run's output and checkpoint 1's output
    assert [entry.output_text for entry in response.context["timeline"]] == ["0", "(undecodable)"]


def test_retry_and_cancel_actions_touch_only_eligible_runs(admin_client):
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    done = run_until_settled(run_start(workflow="tests.sequence", input={}).id)
    assert (failed.status, waiting.status, done.status) == ("failed", "suspended", "completed")
    everything = [failed.id, waiting.id, done.id]

    response = admin_client.post(CHANGELIST, {"action": "retry_runs", ACTION_CHECKBOX_NAME: everything},
                                 follow=True)
    assert "Retried 1 of 3 selected runs" in response.content.decode()
    assert DurableRun.objects.get(pk=failed.id).status == "pending"
    assert DurableRun.objects.get(pk=done.id).status == "completed"

    response = admin_client.post(CHANGELIST, {"action": "cancel_runs", ACTION_CHECKBOX_NAME: everything},
                                 follow=True)
    assert "Cancelled 2 of 3 selected runs" in response.content.decode()
    statuses = dict(DurableRun.objects.filter(pk__in=everything).values_list("id", "status"))
    assert statuses == {failed.id: "cancelled", waiting.id: "cancelled", done.id: "completed"}


def test_signal_action_goes_through_a_form(admin_client):
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    done = run_until_settled(run_start(workflow="tests.sequence", input={}).id)
    selected = {"action": "signal_runs", ACTION_CHECKBOX_NAME: [waiting.id, done.id]}

    form_page = admin_client.post(CHANGELIST, selected)
    assert form_page.status_code == 200
    assert 'name="payload"' in form_page.content.decode()

    invalid = admin_client.post(CHANGELIST, {**selected, "apply": "1", "name": "approve", "payload": "{nope"})
    assert invalid.status_code == 200 and "Not valid JSON" in invalid.content.decode()

    response = admin_client.post(CHANGELIST, {**selected, "apply": "1", "name": "approve",
                                              "payload": '{"by": "admin"}'}, follow=True)
    assert "sent to 1 of 2 selected runs (1 delivered, 0 buffered" in response.content.decode()
    run = run_until_settled(waiting.id)
    assert run.status == "completed"


def test_unfiltered_changelist_estimates_instead_of_counting(admin_client, monkeypatch):
    for index in range(5):
        make(f"e{index}", "completed")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_durablerun")
    monkeypatch.setattr(EstimatedCountPaginator, "exact_below", 0)  # the runs list's RunsPaginator inherits it
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    counts = [q["sql"] for q in captured if "COUNT(" in q["sql"].upper() and "durable_durablerun" in q["sql"]]
    assert counts == []
    assert response.context["cl"].result_count == 5  # reltuples after ANALYZE
    filtered = admin_client.get(CHANGELIST + "?status__exact=completed")
    assert filtered.context["cl"].result_count == 5


def test_changelist_query_count_does_not_grow_with_rows(admin_client):
    make("q0", "completed")
    with CaptureQueriesContext(connection) as one:
        assert admin_client.get(CHANGELIST).status_code == 200
    for index in range(1, 40):
        make(f"q{index}", "completed")
    with CaptureQueriesContext(connection) as forty:
        assert admin_client.get(CHANGELIST).status_code == 200
    assert len(one) == len(forty)


def test_schedule_admin_validates_and_saves_through_the_service(admin_client):
    add = reverse("admin:durable_schedule_add")
    form = {"key": "hourly", "workflow": "tests.sequence", "namespace": "default", "input": "{}",
            "every_seconds": "", "cron": "0 * * * *", "timezone": "UTC", "overlap": "allow", "jitter_seconds": "0",
            "catchup_limit": "1", "tags": ""}
    bad = admin_client.post(add, {**form, "cron": "every hour"})
    assert bad.status_code == 200
    assert "cron" in bad.context["adminform"].form.errors
    bad = admin_client.post(add, {**form, "workflow": "nope"})
    assert "workflow" in bad.context["adminform"].form.errors
    bad = admin_client.post(add, {**form, "every_seconds": "60"})
    assert "every_seconds" in bad.context["adminform"].form.errors
    response = admin_client.post(add, form)
    assert response.status_code == 302, response.context["adminform"].form.errors
    schedule = Schedule.objects.get(key="hourly")
    assert schedule.next_fire_at is not None  # computed by schedule_save
    change = reverse("admin:durable_schedule_change", args=[schedule.pk])
    assert admin_client.get(change).status_code == 200
    admin_client.post(reverse("admin:durable_schedule_changelist"),
                      {"action": "pause_schedules", ACTION_CHECKBOX_NAME: [schedule.pk]})
    assert Schedule.objects.get(pk=schedule.pk).paused is True


def test_buffered_signals_and_events_are_read_only_pages(admin_client):
    early = run_start(workflow="tests.signal", input={})
    assert signal_send(run_id=early.id, name="approve", payload={"x": 1}) == "buffered"
    from durable.services import event_publish

    event_publish(name="nobody.listens", payload={"y": 2})
    signal = BufferedSignal.objects.get()
    event = BufferedEvent.objects.get()
    assert admin_client.get(reverse("admin:durable_bufferedsignal_changelist")).status_code == 200
    page = admin_client.get(reverse("admin:durable_bufferedsignal_change", args=[signal.pk]))
    assert page.status_code == 200 and "&quot;x&quot;: 1" in page.content.decode()
    assert admin_client.get(reverse("admin:durable_bufferedevent_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:durable_bufferedevent_change", args=[event.pk])).status_code == 200
    assert admin_client.get(reverse("admin:durable_bufferedsignal_add")).status_code == 403


# ------------------------------------------------------------------------------------ the run page's buttons


def act_url(run_id, action):
    return reverse(f"admin:durable_durablerun_{action}", args=[quote(run_id)])


def buttons(html):
    return {name for name in ("retry", "cancel", "signal") if f'id="durable-{name}"' in html}


def test_the_run_page_offers_the_buttons_its_status_allows(admin_client):
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    done = run_until_settled(run_start(workflow="tests.sequence", input={}).id)
    assert buttons(admin_client.get(change_url(failed.id)).content.decode()) == {"retry"}
    assert buttons(admin_client.get(change_url(waiting.id)).content.decode()) == {"cancel", "signal"}
    assert buttons(admin_client.get(change_url(done.id)).content.decode()) == set()


def test_retry_button_runs_a_failed_run_again_and_its_page_keeps_the_failure_it_ended(admin_client):
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    response = admin_client.post(act_url(failed.id, "retry"), follow=True)
    assert response.redirect_chain[-1][0] == change_url(failed.id)
    html = response.content.decode()
    assert f"Retried run {failed.id}" in html and "asked to fail" in html  # the message names what it ended
    assert DurableRun.objects.get(pk=failed.id).status == "pending"
    second = admin_client.post(act_url(failed.id, "retry"), follow=True)  # a second operator, a moment late
    assert f"Run {failed.id} was not retried: it is pending" in second.content.decode()

    again = run_until_settled(failed.id)
    assert again.status == "failed"
    page = admin_client.get(change_url(failed.id))
    history = page.context["history"]
    assert (history["attempt"], history["retries"]) == (2, 1)
    log = page.context["admin_log"]
    assert len(log) == 1 and "The attempt it ended: failed: StepFailed" in log[0]["action"]
    assert "Traceback (most recent call last)" in log[0]["traceback"]
    assert 'id="durable-log"' in page.content.decode()


def test_a_retry_erased_error_is_read_nowhere_but_the_log(admin_client):
    """A run retried elsewhere (the API, a script) shows its attempt count; its earlier error is gone."""
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    assert run_retry(run_id=failed.id)
    page = admin_client.get(change_url(failed.id))
    assert page.context["history"]["attempt"] == 2 and page.context["admin_log"] == []
    assert "A retry erases the error" in page.content.decode()


def test_retry_button_on_a_run_that_cannot_be_retried_says_why(admin_client):
    done = run_until_settled(run_start(workflow="tests.sequence", input={}).id)
    response = admin_client.post(act_url(done.id, "retry"), follow=True)
    assert f"Run {done.id} was not retried: it is completed" in response.content.decode()
    assert DurableRun.objects.get(pk=done.id).status == "completed"


def test_cancel_button_cancels_an_active_run(admin_client):
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    response = admin_client.post(act_url(waiting.id, "cancel"), follow=True)
    assert f"Cancelled run {waiting.id}" in response.content.decode()
    assert DurableRun.objects.get(pk=waiting.id).status == "cancelled"
    again = admin_client.post(act_url(waiting.id, "cancel"), follow=True)
    assert "was not cancelled: it is cancelled" in again.content.decode()


def test_signal_button_delivers_and_shows_bad_json_on_its_field(admin_client):
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    bad = admin_client.post(act_url(waiting.id, "signal"), {"name": "approve", "payload": "{nope"})
    assert bad.status_code == 200
    html = bad.content.decode()
    field = html[html.index('id="durable-signal-payload"'):]
    assert re.match(r'.*?</p>\s*<ul class="errorlist[^"]*"[^>]*><li>Not valid JSON', field, re.S)
    assert 'id="durable-signal" open' in html
    assert "{nope" in html  # what was typed stays in the field
    assert DurableRun.objects.get(pk=waiting.id).status == "suspended"
    missing = admin_client.post(act_url(waiting.id, "signal"), {"name": "", "payload": "{}"})
    assert "This field is required" in missing.content.decode()

    response = admin_client.post(act_url(waiting.id, "signal"), {"name": "approve", "payload": '{"by": "admin"}'},
                                 follow=True)
    assert f"Signal &#x27;approve&#x27; sent to run {waiting.id}: delivered" in response.content.decode()
    run = run_until_settled(waiting.id)
    assert run.status == "completed"


def test_buttons_only_answer_posts(admin_client):
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    assert admin_client.get(act_url(waiting.id, "cancel")).status_code == 405
    assert DurableRun.objects.get(pk=waiting.id).status == "suspended"


def test_buttons_refuse_a_post_without_the_csrf_token(admin_user):
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(act_url(failed.id, "retry")).status_code == 403
    assert DurableRun.objects.get(pk=failed.id).status == "failed"
    page = client.get(change_url(failed.id))
    token = page.cookies["csrftoken"].value
    assert client.post(act_url(failed.id, "retry"), {"csrfmiddlewaretoken": token}).status_code == 302
    assert DurableRun.objects.get(pk=failed.id).status == "pending"


def staff_of(workspace, *codenames):
    user = UserFactory(username=f"staff-{workspace.slug}-{len(codenames)}", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="durable", codename__in=codenames))
    MembershipFactory(user=user, workspace=workspace, role=Membership.Role.OWNER)
    client = Client()
    client.force_login(user)
    return client


def test_buttons_need_the_change_permission_and_a_run_the_user_sees():
    ours, theirs = WorkspaceFactory(slug="ours"), WorkspaceFactory(slug="theirs")
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True},
                                         namespace=ours.namespace).id)
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}, namespace=ours.namespace).id)
    reader = staff_of(ours, "view_durablerun")
    page = reader.get(change_url(failed.id))
    assert page.status_code == 200 and buttons(page.content.decode()) == set()
    assert reader.post(act_url(failed.id, "retry")).status_code == 403
    assert reader.post(act_url(waiting.id, "cancel")).status_code == 403
    assert reader.post(act_url(waiting.id, "signal"), {"name": "approve", "payload": "{}"}).status_code == 403
    listed = reader.post(CHANGELIST, {"action": "retry_runs", ACTION_CHECKBOX_NAME: [failed.id]})
    assert listed.status_code == 200  # the list offers no action it may not take
    assert DurableRun.objects.get(pk=failed.id).status == "failed"

    outsider = staff_of(theirs, "view_durablerun", "change_durablerun")
    assert outsider.get(change_url(failed.id)).status_code == 404
    assert outsider.post(act_url(failed.id, "retry")).status_code == 404
    assert outsider.post(act_url(waiting.id, "cancel")).status_code == 404
    assert outsider.post(act_url(waiting.id, "signal"), {"name": "approve", "payload": "{}"}).status_code == 404
    assert outsider.get(change_url("no-such-run")).status_code == 404
    statuses = dict(DurableRun.objects.filter(pk__in=[failed.id, waiting.id]).values_list("id", "status"))
    assert statuses == {failed.id: "failed", waiting.id: "suspended"}

    operator = staff_of(ours, "view_durablerun", "change_durablerun")
    assert buttons(operator.get(change_url(failed.id)).content.decode()) == {"retry"}
    assert operator.post(act_url(failed.id, "retry")).status_code == 302
    assert DurableRun.objects.get(pk=failed.id).status == "pending"


# ------------------------------------------------------------------------------------- what the page draws


def test_a_failed_runs_error_reads_as_a_message_and_a_traceback(admin_client):
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    html = admin_client.get(change_url(failed.id)).content.decode()
    assert "&quot;traceback&quot;" not in html  # not the stored JSON
    assert '<strong>StepFailed</strong>: step &#x27;check&#x27; failed: ValueError: asked to fail' in html
    traces = re.findall(r'<pre class="durable-traceback">(.*?)</pre>', html, re.S)
    assert len(traces) == 2  # the run's and its failed step's
    assert all(trace.startswith("Traceback (most recent call last)") for trace in traces)
    step_row = html[html.index('id="checkpoint-0"'):]
    assert "<strong>ValueError</strong>: asked to fail" in step_row[:step_row.index("</tr>")]


def gantt_rows(html):
    return re.findall(r'<g class="durable-gantt-row durable-gantt-(\w+)" data-seq="(\d+)">', html)


def test_gantt_chart_draws_a_row_a_step_and_folds_a_fan(admin_client):
    run = run_until_settled(run_start(workflow="tests.fan", input={"n": 30}).id)
    html = admin_client.get(change_url(run.id)).content.decode()
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="durable-gantt"' in html
    assert gantt_rows(html) == [("completed", "0")]  # thirty steps of one fan, one row
    assert "fan 0: 30 steps" in html

    sequence = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 3}).id)
    html = admin_client.get(change_url(sequence.id)).content.decode()
    assert [seq for _status, seq in gantt_rows(html)] == ["0", "1", "2"]

    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    assert gantt_rows(admin_client.get(change_url(failed.id)).content.decode()) == [("failed", "0")]


def test_a_long_gantt_chart_is_paged_with_a_show_all_link(admin_client):
    run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 230}).id)
    html = admin_client.get(change_url(run.id)).content.decode()
    assert len(gantt_rows(html)) == 200 and 'id="durable-gantt-all"' in html
    html = admin_client.get(change_url(run.id) + "?gantt=all").content.decode()
    assert len(gantt_rows(html)) == 230 and 'id="durable-gantt-all"' not in html


def test_run_page_links_to_the_rows_it_drives(admin_client, make_version, invoke):
    from tests.builders import graph, node

    invocation = invoke(make_version(graph("a", node("a", model="offline-directive-v1"))))
    html = admin_client.get(change_url(invocation.durable_run_id)).content.decode()
    url = reverse("admin:workflows_workflowinvocation_change", args=[invocation.pk])
    assert f'<a href="{url}">invocation {invocation.pk}</a>' in html

    run = run_start(workflow="tests.sequence", input={})
    source = KnowledgeSourceFactory(ingest_run=run)
    html = admin_client.get(change_url(run.id)).content.decode()
    assert reverse("admin:knowledge_knowledgesource_change", args=[source.pk]) in html


def test_run_page_query_count_does_not_grow_with_steps(admin_client, django_assert_max_num_queries):
    small = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2}).id)
    big = run_until_settled(run_start(workflow="tests.parent", input={}).id)
    fan = run_until_settled(run_start(workflow="tests.fan", input={"n": 80}).id)
    long = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 120}).id)
    for run in (small, big, fan, long):
        with django_assert_max_num_queries(24):
            assert admin_client.get(change_url(run.id)).status_code == 200


# ------------------------------------------------------------------------------------------------ the list


def listed(client, query=""):
    response = client.get(CHANGELIST + query)
    assert response.status_code == 200, response
    return [obj.pk for obj in response.context["cl"].result_list]


def test_changelist_folds_children_under_their_parent(admin_client):
    parent = run_until_settled(run_start(workflow="tests.parent", input={}).id)
    children = set(DurableRun.objects.filter(parent_id=parent.id).values_list("id", flat=True))
    assert len(children) == 4
    assert listed(admin_client) == [parent.id]
    assert set(listed(admin_client, "?children=show")) == {parent.id, *children}
    assert set(listed(admin_client, f"?parent={quote(parent.id)}")) == children
    assert listed(admin_client, f"?q={parent.id}/0") == [f"{parent.id}/0"]  # a search finds a child


def test_changelist_filters_by_creation_window_tag_and_attribute(admin_client):
    recent = run_until_settled(run_start(workflow="tests.values", input={"customer": "initech", "amount": 3},
                                         tags=["nightly"]).id)
    old = make("old-run", "completed")
    DurableRun.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))
    assert set(listed(admin_client)) == {recent.id, "old-run"}
    assert listed(admin_client, "?created=24h") == [recent.id]
    assert set(listed(admin_client, "?created=7d")) == {recent.id, "old-run"}
    assert listed(admin_client, "?tag=nightly") == [recent.id]
    assert listed(admin_client, "?tag=weekly") == []
    assert listed(admin_client, "?attr=amount:gte:3") == [recent.id]
    assert listed(admin_client, "?attr=amount:gt:3") == []
    assert listed(admin_client, "?attr=customer:eq:initech") == [recent.id]
    assert admin_client.get(CHANGELIST + "?attr=amount:gt:lots").status_code == 302  # the admin's "?e=1"
    page = admin_client.get(CHANGELIST).content.decode()
    assert ">nightly</a>" in page  # the tag is a choice of the tag filter
    assert "Last 24 hours" in page or "last 24 hours" in page


def test_changelist_shows_status_badges_ages_and_durations(admin_client):
    done = run_until_settled(run_start(workflow="tests.sequence", input={}).id)
    DurableRun.objects.filter(pk=done.pk).update(created_at=timezone.now() - timedelta(minutes=3))
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    html = admin_client.get(CHANGELIST).content.decode()
    assert '<span class="wf-status wf-status-completed">Completed</span>' in html
    assert '<span class="wf-status wf-status-suspended">Suspended</span>' in html
    assert "3\xa0minutes ago" in html
    assert re.search(r'<td class="field-duration_display">[\d.]+ (ms|s)</td>', html)
    assert re.search(r'<td class="field-duration_display">[\d.]+ (ms|s) so far</td>', html)
    assert waiting.id in html


def test_changelist_query_count_is_bounded_whatever_the_runs(admin_client, django_assert_max_num_queries):
    """Session, user, the filters' choices (once a request), the count, the page, a facet query a filter."""
    make("one", "completed")
    with django_assert_max_num_queries(12):
        assert admin_client.get(CHANGELIST + "?_facets=True").status_code == 200
    for index in range(60):
        DurableRun.objects.create(id=f"many-{index}", workflow="tests.sequence", status="failed", tags=[f"t{index}"])
    parent = run_until_settled(run_start(workflow="tests.parent", input={}).id)
    with django_assert_max_num_queries(12):
        assert admin_client.get(CHANGELIST + "?_facets=True").status_code == 200
    with django_assert_max_num_queries(12):
        assert admin_client.get(CHANGELIST + f"?children=show&created=24h&q={parent.id}").status_code == 200
