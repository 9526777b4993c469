from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from durable import errors, selectors
from durable.errors import RunNotFound
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from durable.services import run_start
from durable.store import upsert_attributes

pytestmark = pytest.mark.django_db


def make_run(run_id, *, namespace="ns-a", workflow="tests.sequence", status="completed", tags=(), attributes=None,
             parent=None, created_at=None):
    run = DurableRun.objects.create(id=run_id, workflow=workflow, namespace=namespace, status=status, tags=list(tags),
                                    parent_id=parent, input='{"x": 1}')
    if created_at is not None:
        DurableRun.objects.filter(pk=run_id).update(created_at=created_at)
    if attributes:
        upsert_attributes(run_id, attributes)
    return run


def ids(queryset):
    return sorted(run.id for run in queryset)


@pytest.fixture
def runs():
    make_run("a1", attributes={"customer": "acme", "amount": 5}, tags=["vip", "eu"])
    make_run("a2", status="failed", attributes={"customer": "globex", "amount": 50}, tags=["eu"])
    make_run("a3", workflow="tests.fan", status="running", attributes={"customer": "acme", "amount": 500})
    make_run("a4", workflow="tests.fan", attributes={"customer": "7"})
    make_run("b1", namespace="ns-b", attributes={"customer": "acme", "amount": 5})


def test_list_filters_by_namespace_workflow_status_and_tags(runs):
    assert ids(selectors.run_list(namespaces=["ns-a"])) == ["a1", "a2", "a3", "a4"]
    assert ids(selectors.run_list(namespaces="ns-b")) == ["b1"]
    assert ids(selectors.run_list(namespaces=["ns-a"], workflow="tests.fan")) == ["a3", "a4"]
    assert ids(selectors.run_list(statuses=["failed", "running"])) == ["a2", "a3"]
    assert ids(selectors.run_list(tags=["eu"])) == ["a1", "a2"]
    assert ids(selectors.run_list(tags=["eu", "vip"])) == ["a1"]


@pytest.mark.parametrize(("op", "value", "expected"), [
    ("eq", "acme", ["a1", "a3", "b1"]),
    ("ne", "acme", ["a2", "a4"]),
    ("eq", "7", ["a4"]),  # a text attribute compared as text
])
def test_text_attribute_comparisons(runs, op, value, expected):
    assert ids(selectors.run_list(attributes=[("customer", op, value)])) == expected


@pytest.mark.parametrize(("op", "value", "expected"), [
    ("eq", "50", ["a2"]),
    ("eq", "50.0", ["a2"]),
    ("ne", "5", ["a2", "a3"]),
    ("gt", "5", ["a2", "a3"]),
    ("gte", "5", ["a1", "a2", "a3", "b1"]),
    ("lt", "50", ["a1", "b1"]),
    ("lte", "50", ["a1", "a2", "b1"]),
])
def test_numeric_attribute_comparisons(runs, op, value, expected):
    assert ids(selectors.run_list(attributes=[("amount", op, value)])) == expected


def test_attribute_comparisons_combine_and_run_in_sql(runs):
    queryset = selectors.run_list(namespaces=["ns-a"], attributes=[("customer", "eq", "acme"), ("amount", "gt", 10)])
    assert ids(queryset) == ["a3"]
    sql = str(queryset.query)
    assert sql.count("EXISTS") == 2
    assert '"input"' not in sql.split("FROM")[0]  # payloads deferred


def test_invalid_attribute_filters_name_the_problem():
    with pytest.raises(errors.InvalidFilter, match="needs a number"):
        selectors.AttributeFilter.parse("amount:gt:lots")
    with pytest.raises(errors.InvalidFilter, match="Unknown comparison"):
        selectors.AttributeFilter.parse("amount:like:5")
    with pytest.raises(errors.InvalidFilter, match="key:op:value"):
        selectors.AttributeFilter.parse("amount")
    assert selectors.AttributeFilter.parse("url:eq:http://x") == selectors.AttributeFilter("url", "eq", "http://x")
    with pytest.raises(errors.InvalidFilter):
        selectors.run_list(statuses=["sleeping"])


def test_created_window_parent_and_ordering(runs):
    old = timezone.now() - timedelta(days=3)
    make_run("old", created_at=old)
    make_run("kid", parent="a1")
    assert ids(selectors.run_list(created_before=timezone.now() - timedelta(days=1))) == ["old"]
    assert "old" not in ids(selectors.run_list(created_after=timezone.now() - timedelta(days=1)))
    assert ids(selectors.run_list(parent="a1")) == ["kid"]
    assert [run.id for run in selectors.run_list()][-1] == "old"
    assert selectors.run_list(ordering=["created_at"]).first().id == "old"
    with pytest.raises(errors.InvalidFilter):
        selectors.run_list(ordering=["input"])


def test_facets_count_by_status_and_workflow_in_one_query(runs, django_assert_num_queries):
    with django_assert_num_queries(1):
        facets = selectors.run_facets(namespaces=["ns-a"])
    assert facets["total"] == 4
    assert facets["status"]["completed"] == 2
    assert facets["status"]["failed"] == 1
    assert facets["status"]["running"] == 1
    assert facets["status"]["dead"] == 0
    assert facets["workflow"] == {"tests.fan": 2, "tests.sequence": 2}
    assert selectors.run_facets(attributes=[("customer", "eq", "acme")])["total"] == 3


def test_timeline_has_durations_and_payloads_only_when_asked():
    run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 3}).id)
    plain = selectors.run_timeline(run.id)
    assert [entry.seq for entry in plain] == [0, 1, 2]
    assert [entry.name for entry in plain] == ["add-0", "add-1", "add-2"]
    assert all(entry.run_seconds is not None and entry.run_seconds >= 0 for entry in plain)
    assert [entry.queue_seconds for entry in plain] == [0, 0, 0]  # inline: run in the turn, never queued
    assert all(entry.created_at == entry.started_at <= entry.completed_at for entry in plain)
    assert plain[2].output is None and not plain[2].payloads_included
    full = selectors.run_timeline(run.id, include_payloads=True)
    assert full[2].output == 3
    assert [entry.seq for entry in selectors.run_timeline(run.id, after_seq=0, limit=1)] == [1]


def test_timeline_of_queued_steps_measures_the_queue():
    run = run_until_settled(run_start(workflow="tests.queued").id)
    assert run.status == "completed"
    entries = selectors.run_timeline(run.id)
    assert [entry.queue for entry in entries] == ["steps", "steps"]
    assert all(entry.queue_seconds is not None and entry.queue_seconds >= 0 for entry in entries)


def test_fan_stats_group_by_fan_status_and_kind():
    run = run_until_settled(run_start(workflow="tests.fan", input={"n": 5}).id)
    assert run.status == "completed"
    buckets = selectors.fan_stats(run.id)
    fan = [bucket for bucket in buckets if bucket["parallel_group"] is not None]
    assert len(fan) == 1
    bucket = fan[0]
    assert (bucket["status"], bucket["kind"], bucket["count"]) == ("completed", "step", 5)
    assert bucket["max_seq"] - bucket["min_seq"] == 4
    assert bucket["attempts"] >= 5
    assert selectors.fan_stats(run.id, group=bucket["parallel_group"]) == fan
    assert selectors.fan_stats(run.id, group=12345) == []


def test_children_and_detail():
    run = run_until_settled(run_start(workflow="tests.parent", namespace="ns-a").id)
    assert run.status == "completed"
    children = list(selectors.run_children(run.id))
    assert len(children) == 4
    assert {child.namespace for child in children} == {"ns-a"}
    detail = selectors.run_detail(run.id)
    assert detail.output == {"one": {"child": 2}, "many": [{"child": 0}, {"child": 2}, {"child": 4}]}
    assert detail.input is None and detail.undecodable == []
    assert detail.children == [child.id for child in children]


def test_detail_decodes_attributes_and_reports_a_corrupt_payload_once(caplog):
    run = run_until_settled(run_start(workflow="tests.values", input={"customer": "acme", "amount": 12}).id)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE durable_durablerun SET output = %s WHERE id = %s", ["{not json", run.id])
    detail = selectors.run_detail(run.id)
    assert detail.output is None
    assert detail.undecodable == ["output"]
    assert detail.input == {"customer": "acme", "amount": 12}
    assert detail.attributes == {"amount": 12, "customer": "acme"}
    selectors.run_detail(run.id)
    assert sum("undecodable payload in run.output" in record.getMessage() for record in caplog.records) == 1
    assert [r.id for r in selectors.run_list()] == [run.id]  # the list never reads the payload


def test_scoped_reader_never_sees_another_namespace(runs):
    reader = selectors.scoped("ns-b")
    assert ids(reader.list()) == ["b1"]
    assert ids(reader.list(namespaces=["ns-a"])) == ["b1"]  # cannot be widened
    assert reader.facets()["total"] == 1
    assert reader.detail("b1").id == "b1"
    for read in (reader.detail, reader.timeline, reader.children, reader.fan_stats):
        with pytest.raises(RunNotFound):
            read("a1")
    with pytest.raises(RunNotFound):
        selectors.run_timeline("missing")


def test_list_reads_are_one_query_whatever_the_size(django_assert_num_queries):
    for index in range(3):
        make_run(f"r{index}", attributes={"amount": index})
    with django_assert_num_queries(1):
        list(selectors.run_list(attributes=[("amount", "gte", 0)]))
    for index in range(3, 40):
        make_run(f"r{index}", attributes={"amount": index})
    with django_assert_num_queries(1):
        assert len(list(selectors.run_list(attributes=[("amount", "gte", 0)]))) == 40
