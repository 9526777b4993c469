from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from durable.inprocess import run_until_settled
from durable.models import DurableRun, Schedule
from durable.services import run_start
from durable.store import upsert_attributes

pytestmark = pytest.mark.django_db

RUNS = "/api/durable/runs/"
SCHEDULES = "/api/durable/schedules/"


def make_runs(namespace, count, *, status="completed", workflow="tests.sequence", prefix="r", attributes=True):
    now = timezone.now()
    DurableRun.objects.bulk_create([
        DurableRun(id=f"{prefix}{index}", workflow=workflow, namespace=namespace, status=status, tags=["t"],
                   input=f'{{"i": {index}}}')
        for index in range(count)
    ])
    DurableRun.objects.filter(id__startswith=prefix).update(created_at=now)
    if attributes:
        for index in range(count):
            upsert_attributes(f"{prefix}{index}", {"amount": index, "customer": "acme"})


def error(response):
    return response.json()["error"]


# ------------------------------------------------------------------------------------- scoping


def test_list_shows_only_the_callers_namespaces(api_as, owner, outsider, workspace, other_workspace):
    make_runs(workspace.namespace, 2, prefix="mine")
    make_runs(other_workspace.namespace, 3, prefix="theirs")
    make_runs("default", 1, prefix="system")
    response = api_as(owner).get(RUNS)
    assert response.status_code == 200
    assert sorted(row["id"] for row in response.json()["results"]) == ["mine0", "mine1"]
    assert {row["workspace"] for row in response.json()["results"]} == {workspace.pk}
    theirs = api_as(outsider).get(RUNS).json()["results"]
    assert sorted(row["id"] for row in theirs) == ["theirs0", "theirs1", "theirs2"]


@pytest.mark.parametrize(("method", "suffix"), [
    ("get", ""), ("get", "timeline/"), ("get", "fan-stats/"), ("post", "signal/"), ("post", "cancel/"),
    ("post", "retry/"),
])
def test_another_workspaces_run_is_404(api_as, owner, other_workspace, method, suffix):
    run = run_start(workflow="tests.signal", input={}, namespace=other_workspace.namespace)
    response = getattr(api_as(owner), method)(f"{RUNS}{run.id}/{suffix}", {"name": "approve"}, format="json") \
        if method == "post" else api_as(owner).get(f"{RUNS}{run.id}/{suffix}")
    assert response.status_code == 404
    assert DurableRun.objects.get(pk=run.id).status == "pending"


def test_anonymous_is_refused(api):
    assert api.get(RUNS).status_code in (401, 403)


# ------------------------------------------------------------------------------------- filters


def test_filters_and_attribute_comparisons(api_as, owner, workspace):
    ns = workspace.namespace
    make_runs(ns, 4, prefix="ok")
    make_runs(ns, 2, prefix="bad", status="failed", workflow="tests.fan", attributes=False)
    DurableRun.objects.filter(pk="ok0").update(tags=["vip", "t"])
    DurableRun.objects.filter(pk="ok1").update(parent_id="ok0", created_at=timezone.now() - timedelta(days=2))
    client = api_as(owner)

    def fetch(query):
        response = client.get(RUNS + query)
        assert response.status_code == 200, response.json()
        return sorted(row["id"] for row in response.json()["results"])

    assert fetch("?workflow=tests.fan") == ["bad0", "bad1"]
    assert fetch("?status=failed&status=completed") == ["bad0", "bad1", "ok0", "ok1", "ok2", "ok3"]
    assert fetch("?status=failed") == ["bad0", "bad1"]
    assert fetch("?tag=vip") == ["ok0"]
    assert fetch("?attr=amount:gte:2") == ["ok2", "ok3"]
    assert fetch("?attr=amount:gte:1&attr=amount:lt:3") == ["ok1", "ok2"]
    assert fetch("?attr=customer:eq:acme&attr=amount:ne:0") == ["ok1", "ok2", "ok3"]
    assert fetch("?parent=ok0") == ["ok1"]
    after = (timezone.now() - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert "ok1" not in fetch(f"?created_after={after}")
    assert fetch(f"?created_before={after}") == ["ok1"]
    assert fetch(f"?workspace={workspace.pk}") == ["bad0", "bad1", "ok0", "ok1", "ok2", "ok3"]
    row = client.get(RUNS + "?attr=amount:eq:3").json()["results"][0]
    assert row["attributes"] == {"amount": 3, "customer": "acme"}
    assert "input" not in row


@pytest.mark.parametrize(("query", "param"), [
    ("?status=sleeping", "status"),
    ("?attr=amount:gt:lots", "attr"),
    ("?attr=amount:like:3", "attr"),
    ("?attr=amount", "attr"),
    ("?created_after=yesterday", "created_after"),
    ("?page_size=0", "page_size"),
    ("?cursor=garbage", "cursor"),
])
def test_bad_parameters_are_400_naming_the_parameter(api_as, owner, query, param):
    response = api_as(owner).get(RUNS + query)
    assert response.status_code == 400
    assert param in error(response)["fields"]


def test_cursor_pages_are_stable_and_capped(api_as, owner, workspace):
    make_runs(workspace.namespace, 7, prefix="p", attributes=False)
    client = api_as(owner)
    seen, url = [], RUNS + "?page_size=3"
    while url:
        body = client.get(url).json()
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    assert sorted(seen) == sorted(f"p{i}" for i in range(7)) and len(seen) == 7
    assert client.get(RUNS + "?page_size=1000").status_code == 200  # clamped to 200


def test_facets_follow_the_filters(api_as, owner, workspace, other_workspace):
    make_runs(workspace.namespace, 3, prefix="ok")
    make_runs(workspace.namespace, 2, prefix="bad", status="failed", workflow="tests.fan", attributes=False)
    make_runs(other_workspace.namespace, 5, prefix="x")
    client = api_as(owner)
    facets = client.get(RUNS + "facets/").json()
    assert facets["total"] == 5
    assert facets["status"]["completed"] == 3 and facets["status"]["failed"] == 2
    assert facets["workflow"] == {"tests.fan": 2, "tests.sequence": 3}
    assert client.get(RUNS + "facets/?attr=amount:gt:0").json()["total"] == 2
    assert client.get(RUNS + "facets/?status=nope").status_code == 400


# --------------------------------------------------------------------------------- one run


def test_detail_timeline_and_fan_stats(api_as, owner, workspace):
    run = run_until_settled(run_start(workflow="tests.fan", input={"n": 4}, namespace=workspace.namespace).id)
    client = api_as(owner)
    detail = client.get(f"{RUNS}{run.id}/").json()
    assert detail["status"] == "completed"
    assert detail["input"] == {"n": 4} and detail["output"] == 0 + 1 + 4 + 9
    assert detail["error"] is None and detail["undecodable"] == [] and detail["children"] == []

    timeline = client.get(f"{RUNS}{run.id}/timeline/").json()
    assert [cp["seq"] for cp in timeline["checkpoints"]] == [0, 1, 2, 3]
    assert all("output" not in cp for cp in timeline["checkpoints"])
    assert all(cp["run_seconds"] is not None for cp in timeline["checkpoints"])
    with_payloads = client.get(f"{RUNS}{run.id}/timeline/?payloads=1").json()
    assert [cp["output"] for cp in with_payloads["checkpoints"]] == [0, 1, 4, 9]
    page = client.get(f"{RUNS}{run.id}/timeline/?limit=3").json()
    assert len(page["checkpoints"]) == 3 and page["next_after"] == 2
    rest = client.get(f"{RUNS}{run.id}/timeline/?after=2").json()
    assert [cp["seq"] for cp in rest["checkpoints"]] == [3] and rest["next_after"] is None
    assert client.get(f"{RUNS}{run.id}/timeline/?limit=x").status_code == 400

    stats = client.get(f"{RUNS}{run.id}/fan-stats/").json()
    assert stats["run"] == run.id
    [bucket] = stats["buckets"]
    assert (bucket["status"], bucket["kind"], bucket["count"], bucket["min_seq"], bucket["max_seq"]) == \
        ("completed", "step", 4, 0, 3)
    assert client.get(f"{RUNS}{run.id}/fan-stats/?group=99").json()["buckets"] == []


def test_children_are_listed_and_reachable(api_as, owner, workspace):
    run = run_until_settled(run_start(workflow="tests.parent", namespace=workspace.namespace).id)
    client = api_as(owner)
    children = client.get(f"{RUNS}{run.id}/").json()["children"]
    assert len(children) == 4
    assert client.get(f"{RUNS}{children[0]}/").json()["parent"] == run.id  # ids like "<parent>/<seq>" route
    assert client.get(f"{RUNS}{children[0]}/timeline/").status_code == 200
    listed = client.get(RUNS + f"?parent={run.id}").json()["results"]
    assert sorted(row["id"] for row in listed) == sorted(children)


def test_an_undecodable_payload_breaks_neither_list_nor_detail(api_as, owner, workspace):
    run = run_until_settled(run_start(workflow="tests.sequence", input={}, namespace=workspace.namespace).id)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE durable_durablerun SET output = %s WHERE id = %s", ["\x01garbage{", run.id])
        cursor.execute("UPDATE durable_stepcheckpoint SET output = %s WHERE run_id = %s AND seq = 0",
                       ["enc1:not-a-token", run.id])
    client = api_as(owner)
    assert client.get(RUNS).status_code == 200
    detail = client.get(f"{RUNS}{run.id}/").json()
    assert detail["output"] is None and detail["undecodable"] == ["output"]
    timeline = client.get(f"{RUNS}{run.id}/timeline/?payloads=1").json()["checkpoints"]
    assert timeline[0]["output"] is None and timeline[0]["undecodable"] == ["output"]
    assert timeline[1]["output"] == 1


# ---------------------------------------------------------------------------------- writes


def test_start_a_run(api_as, owner, workspace, other_workspace):
    client = api_as(owner)
    response = client.post(RUNS, {"workflow": "tests.sequence", "input": {"steps": 2}, "workspace": workspace.pk,
                                  "tags": ["api"], "priority": 3}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["namespace"] == workspace.namespace and body["tags"] == ["api"] and body["priority"] == 3
    run = run_until_settled(body["id"])
    assert run.status == "completed"

    unknown = client.post(RUNS, {"workflow": "nope", "workspace": workspace.pk}, format="json")
    assert unknown.status_code == 400 and "workflow" in error(unknown)["fields"]
    foreign = client.post(RUNS, {"workflow": "tests.sequence", "workspace": other_workspace.pk}, format="json")
    assert foreign.status_code == 400 and "workspace" in error(foreign)["fields"]
    bad_priority = client.post(RUNS, {"workflow": "tests.sequence", "workspace": workspace.pk, "priority": 12},
                               format="json")
    assert bad_priority.status_code == 400 and "priority" in error(bad_priority)["fields"]


def test_start_is_idempotent_on_run_id_and_never_crosses_namespaces(api_as, owner, workspace, other_workspace):
    client = api_as(owner)
    payload = {"workflow": "tests.sequence", "workspace": workspace.pk, "run_id": "order-42"}
    first = client.post(RUNS, payload, format="json")
    assert first.status_code == 201
    again = client.post(RUNS, payload, format="json")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert client.post(RUNS, {**payload, "run_id": first.json()["id"]}, format="json").status_code == 200
    bad_id = client.post(RUNS, {**payload, "run_id": "a/b"}, format="json")
    assert bad_id.status_code == 400 and "run_id" in error(bad_id)["fields"]


def test_caller_chosen_run_ids_are_per_workspace(api_as, owner, outsider, workspace, other_workspace):
    """Two workspaces both start "nightly": a fresh id and one another workspace uses answer alike (201, a
    run of the caller's), and reads by that id resolve within the caller's workspaces."""
    theirs = api_as(outsider).post(RUNS, {"workflow": "tests.sequence", "workspace": other_workspace.pk,
                                          "run_id": "nightly", "input": {"steps": 1}}, format="json")
    fresh = api_as(owner).post(RUNS, {"workflow": "tests.sequence", "workspace": workspace.pk,
                                      "run_id": "fresh", "input": {"steps": 2}}, format="json")
    ours = api_as(owner).post(RUNS, {"workflow": "tests.sequence", "workspace": workspace.pk,
                                     "run_id": "nightly", "input": {"steps": 2}}, format="json")
    assert theirs.status_code == fresh.status_code == ours.status_code == 201, ours.content
    assert ours.json()["namespace"] == workspace.namespace != theirs.json()["namespace"]
    assert ours.json()["id"] != theirs.json()["id"]
    assert ours.json()["id"].replace("nightly", "fresh") == fresh.json()["id"]  # nothing tells the two apart
    for user, expected in ((owner, ours), (outsider, theirs)):
        client = api_as(user)
        detail = client.get(f"{RUNS}nightly/")
        assert detail.status_code == 200 and detail.json()["id"] == expected.json()["id"]
        assert client.get(f"{RUNS}nightly/timeline/").status_code == 200
        assert client.get(f"{RUNS}{expected.json()['id']}/").status_code == 200
    assert api_as(owner).get(f"{RUNS}{theirs.json()['id']}/").status_code == 404
    assert api_as(owner).post(f"{RUNS}nightly/cancel/", {}, format="json").status_code == 200
    assert DurableRun.objects.get(pk=theirs.json()["id"]).status != "cancelled"


def test_signal_delivered_buffered_and_conflict(api_as, owner, workspace):
    client = api_as(owner)
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}, namespace=workspace.namespace).id)
    assert waiting.status == "suspended"
    response = client.post(f"{RUNS}{waiting.id}/signal/", {"name": "approve", "payload": {"ok": True}}, format="json")
    assert response.status_code == 200 and response.json() == {"result": "delivered"}
    done = run_until_settled(waiting.id)
    assert done.status == "completed"
    assert client.get(f"{RUNS}{done.id}/").json()["output"] == {"before": 1, "payload": {"ok": True}}

    early = run_start(workflow="tests.signal", input={}, namespace=workspace.namespace)
    response = client.post(f"{RUNS}{early.id}/signal/", {"name": "approve", "payload": 7}, format="json")
    assert response.json() == {"result": "buffered"}
    assert run_until_settled(early.id).status == "completed"

    conflict = client.post(f"{RUNS}{done.id}/signal/", {"name": "approve"}, format="json")
    assert conflict.status_code == 409
    assert "completed" in error(conflict)["message"]
    missing_name = client.post(f"{RUNS}{early.id}/signal/", {}, format="json")
    assert missing_name.status_code == 400 and "name" in error(missing_name)["fields"]


def test_cancel_then_retry(api_as, owner, workspace):
    client = api_as(owner)
    run = run_until_settled(run_start(workflow="tests.signal", input={}, namespace=workspace.namespace).id)
    response = client.post(f"{RUNS}{run.id}/cancel/", {"reason": "no longer needed"}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    again = client.post(f"{RUNS}{run.id}/cancel/", format="json")
    assert again.status_code == 409 and "cancelled" in error(again)["message"]
    assert client.get(f"{RUNS}{run.id}/").json()["error"]["message"] == "no longer needed"

    retried = client.post(f"{RUNS}{run.id}/retry/", format="json")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"
    assert run_until_settled(run.id).status == "suspended"  # back to waiting for its signal


def test_retry_with_new_input(api_as, owner, workspace):
    client = api_as(owner)
    run = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True},
                                      namespace=workspace.namespace).id)
    assert run.status == "failed"
    assert client.post(f"{RUNS}{run.id}/retry/", format="json").status_code == 200
    assert run_until_settled(run.id).status == "failed"  # same input, same failure
    response = client.post(f"{RUNS}{run.id}/retry/", {"input": {"fail": False}}, format="json")
    assert response.status_code == 200
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert client.get(f"{RUNS}{run.id}/").json()["input"] == {"fail": False}
    conflict = client.post(f"{RUNS}{run.id}/retry/", format="json")
    assert conflict.status_code == 409


def test_bulk_actions_use_the_list_filters_and_count(api_as, owner, workspace, other_workspace):
    make_runs(workspace.namespace, 3, prefix="f", status="failed", attributes=False)
    make_runs(workspace.namespace, 2, prefix="c", status="completed", attributes=False)
    make_runs(workspace.namespace, 2, prefix="s", status="suspended", workflow="tests.signal", attributes=False)
    make_runs(other_workspace.namespace, 2, prefix="o", status="failed", attributes=False)
    client = api_as(owner)

    assert client.post(RUNS + "bulk-retry/").status_code == 400  # no filter: refused
    response = client.post(RUNS + "bulk-retry/?workflow=tests.sequence")
    assert response.json() == {"matched": 3, "applied": 3, "limit": 500, "more": False}
    assert set(DurableRun.objects.filter(id__startswith="f").values_list("status", flat=True)) == {"pending"}
    assert set(DurableRun.objects.filter(id__startswith="o").values_list("status", flat=True)) == {"failed"}

    response = client.post(RUNS + "bulk-cancel/?status=suspended&status=completed", {"reason": "cleanup"},
                           format="json")
    assert response.json() == {"matched": 2, "applied": 2, "limit": 500, "more": False}
    assert set(DurableRun.objects.filter(id__startswith="c").values_list("status", flat=True)) == {"completed"}
    assert client.post(RUNS + "bulk-cancel/?status=bogus").status_code == 400


def test_bulk_actions_are_capped_at_500(api_as, owner, workspace):
    make_runs(workspace.namespace, 503, prefix="many", status="failed", attributes=False)
    response = api_as(owner).post(RUNS + "bulk-retry/?status=failed")
    assert response.json() == {"matched": 500, "applied": 500, "limit": 500, "more": True}
    assert DurableRun.objects.filter(status="failed").count() == 3


# -------------------------------------------------------------------------------- schedules


def test_schedules_create_update_pause_and_scope(api_as, owner, outsider, workspace):
    client = api_as(owner)
    response = client.post(SCHEDULES, {"key": "nightly", "workflow": "tests.sequence", "workspace": workspace.pk,
                                       "every_seconds": 3600, "input": {"steps": 1}}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["namespace"] == workspace.namespace and body["next_fire_at"] and body["workspace_id"] == workspace.pk
    url = f"{SCHEDULES}{body['id']}/"

    changed = client.patch(url, {"cron": "0 3 * * *", "timezone": "Europe/Paris"}, format="json").json()
    assert changed["cron"] == "0 3 * * *" and changed["every_seconds"] is None and changed["key"] == "nightly"
    assert client.post(url + "pause/").json()["paused"] is True
    assert client.post(url + "resume/").json()["paused"] is False
    assert Schedule.objects.count() == 1

    assert api_as(outsider).get(url).status_code == 404
    assert api_as(outsider).post(url + "pause/").status_code == 404
    assert api_as(outsider).get(SCHEDULES).json()["results"] == []


@pytest.mark.parametrize(("payload", "field"), [
    ({"workflow": "nope", "every_seconds": 60}, "workflow"),
    ({"cron": "not a cron"}, "cron"),
    ({"every_seconds": 60, "cron": "* * * * *"}, "every_seconds"),
    ({}, "every_seconds"),
    ({"every_seconds": 60, "timezone": "Mars/Olympus"}, "timezone"),
    ({"every_seconds": 60, "overlap": "sometimes"}, "overlap"),
])
def test_schedule_validation_names_the_field(api_as, owner, workspace, payload, field):
    body = {"key": "k1", "workflow": "tests.sequence", "workspace": workspace.pk, **payload}
    response = api_as(owner).post(SCHEDULES, body, format="json")
    assert response.status_code == 400
    assert field in error(response)["fields"], error(response)


def test_schedule_keys_are_per_workspace_and_never_take_over_another(api_as, owner, workspace, other_workspace):
    from durable.services import schedule_save

    schedule_save(key="shared", workflow="tests.sequence", namespace=other_workspace.namespace, every_seconds=60)
    response = api_as(owner).post(SCHEDULES, {"key": "shared", "workflow": "tests.fan", "workspace": workspace.pk,
                                              "every_seconds": 5}, format="json")
    assert response.status_code == 201  # the other workspace's key says nothing about it, and is not touched
    theirs = Schedule.objects.get(key="shared", namespace=other_workspace.namespace)
    assert (theirs.workflow, theirs.every_seconds) == ("tests.sequence", 60)
    ours = Schedule.objects.get(key="shared", namespace=workspace.namespace)
    assert (ours.workflow, ours.every_seconds) == ("tests.fan", 5)
    again = api_as(owner).post(SCHEDULES, {"key": "shared", "workflow": "tests.fan", "workspace": workspace.pk,
                                           "every_seconds": 5}, format="json")
    assert again.status_code == 400 and "key" in error(again)["fields"]


# ------------------------------------------------------------------------------ query budgets


def _count_queries(client, url):
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured), response


@pytest.mark.parametrize("url", [RUNS, RUNS + "?attr=amount:gte:0&status=completed", RUNS + "facets/"])
def test_run_list_query_count_is_the_same_for_1_and_50_rows(api_as, owner, workspace, url):
    client = api_as(owner)
    make_runs(workspace.namespace, 1, prefix="one")
    one, first = _count_queries(client, url)
    make_runs(workspace.namespace, 49, prefix="more")
    fifty, second = _count_queries(client, url)
    assert one == fifty
    assert one <= 2  # the page (namespaces are a subquery) and its attributes
    if "facets" not in url:
        assert len(first.json()["results"]) == 1 and len(second.json()["results"]) == 50


def test_schedule_list_query_count_is_the_same_for_1_and_50_rows(api_as, owner, workspace):
    from durable.services import schedule_save

    client = api_as(owner)
    schedule_save(key="s0", workflow="tests.sequence", namespace=workspace.namespace, every_seconds=60)
    one, _ = _count_queries(client, SCHEDULES)
    for index in range(1, 50):
        schedule_save(key=f"s{index}", workflow="tests.sequence", namespace=workspace.namespace, every_seconds=60)
    fifty, response = _count_queries(client, SCHEDULES)
    assert one == fifty
    assert len(response.json()["results"]) == 50


# ----------------------------------------------------------------------------------- schema


def test_schema_documents_the_durable_api_without_warnings(api_as, owner):
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    durable_warnings = [msg for msg in [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
                        if "durable" in msg.lower()]
    assert durable_warnings == []
    paths = schema["paths"]
    for path in ["/api/durable/runs/", "/api/durable/runs/facets/", "/api/durable/runs/{id}/timeline/",
                 "/api/durable/runs/{id}/fan-stats/", "/api/durable/runs/{id}/signal/",
                 "/api/durable/runs/bulk-retry/", "/api/durable/schedules/{id}/pause/"]:
        assert path in paths, path
    assert "post" in paths["/api/durable/events/"]  # events are published into one workspace
    assert {p["name"] for p in paths["/api/durable/runs/"]["get"]["parameters"]} >= {"workflow", "status", "tag",
                                                                                     "attr", "cursor"}
    assert api_as(owner).get("/api/schema/").status_code == 200


def test_publish_an_event_reaches_only_the_workspaces_runs(api_as, owner, outsider, workspace, other_workspace):
    ours = run_until_settled(run_start(workflow="tests.event", input={"order": 5}, namespace=workspace.namespace).id)
    theirs = run_until_settled(run_start(workflow="tests.event", input={"order": 5},
                                         namespace=other_workspace.namespace).id)
    response = api_as(owner).post("/api/durable/events/", {"workspace": workspace.pk, "name": "order.paid",
                                                           "payload": {"order": 5}}, format="json")
    assert response.status_code == 202
    assert response.json() == {"reached": 1, "buffered": False}
    assert run_until_settled(ours.id).status == "completed"
    assert run_until_settled(theirs.id).status == "suspended"
    # an outsider cannot publish into a workspace they do not belong to
    refused = api_as(outsider).post("/api/durable/events/", {"workspace": workspace.pk, "name": "order.paid",
                                                             "payload": {"order": 5}}, format="json")
    assert refused.status_code == 400 and "workspace" in refused.json()["error"]["fields"]


def test_publish_validates_the_payload(api_as, owner, workspace):
    response = api_as(owner).post("/api/durable/events/", {"workspace": workspace.pk, "name": "x", "payload": [1]},
                                  format="json")
    assert response.status_code == 400 and "payload" in response.json()["error"]["fields"]


def test_cancel_with_compensation(api_as, owner, workspace):
    run = run_until_settled(run_start(workflow="tests.compensated", input={"order": 1},
                                      namespace=workspace.namespace).id)
    response = api_as(owner).post(f"{RUNS}{run.id}/cancel/", {"compensate": True}, format="json")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    undo = DurableRun.objects.get(pk=f"{run.id}:compensate")
    assert undo.workflow == "tests.undo" and undo.namespace == workspace.namespace  # visible to the same workspace


def test_the_demo_run_and_schedule_are_the_demo_workspaces_through_the_api(api_as, settings):
    """The README's examples: the admin login reads the demo run and its schedule through the API."""
    from io import StringIO

    from django.contrib.auth import get_user_model

    from durable import demo

    settings.DURABLE_DISPATCH_ENABLED = False
    admin = get_user_model().objects.create_superuser("admin", "admin@example.org", "a long demo password")
    run_start(workflow="durable.demo.digest", run_id="demo-digest", tags=["demo"])  # as an older seed left it
    demo.seed(StringIO())
    demo.seed(StringIO())  # idempotent
    client = api_as(admin)
    run = client.get(f"{RUNS}demo-digest/")
    assert run.status_code == 200, run.content
    from workspaces.models import Workspace

    assert run.json()["namespace"] == Workspace.objects.get(slug="demo").namespace
    schedules = client.get(SCHEDULES).json()["results"]
    assert [schedule["key"] for schedule in schedules] == ["demo-digest-every-10-minutes"]
