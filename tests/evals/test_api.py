"""The evals API: golden sets (CRUD, graders, import from JSONL and CSV, compare), golden items, eval runs (start,
cancel, results, histogram, rewrite), promotion and rollback, scoped to the caller's workspaces."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve

from evals.api import views
from evals.graders import GRADER_KINDS
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet, Promotion
from evals.services import eval_run_start, golden_item_add, golden_set_create
from tests.builders import graph, node
from tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from workflows.models import WorkflowVersion
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

SETS = "/api/golden-sets/"
ITEMS_URL = "/api/golden-items/"
RUNS = "/api/eval-runs/"
PROMOTIONS = "/api/promotions/"
VERSIONS = "/api/workflow-versions/"
WORKFLOWS = "/api/workflows/"
MISSING = object()


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Eval runs started here are driven in-process (or left queued): no worker listens."""
    settings.DURABLE_DISPATCH_ENABLED = False


def error_of(response, status=400) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:3000])
    return response.json()["error"]


def _count(client, url, params=None):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params or {})
    assert response.status_code == 200, response.content[:2000]
    return len(queries), response


def make_set(workspace, name="set", items=1, **kwargs) -> GoldenSet:
    golden = golden_set_create(workspace=workspace, name=name, graders=kwargs.pop("graders", [{"kind": "contains"}]),
                               **kwargs)
    for index in range(items):
        golden_item_add(golden_set=golden, input={"text": f"q{index}"}, expected_output=f"a{index}")
    return golden


def new_version(workspace, name="flow", prompt="Answer."):
    workflow = workflow_create(workspace=workspace, name=name)
    version, _ = workflow_version_create(workflow=workflow, dsl=graph("a", node("a", prompt=prompt)))
    return version


def make_run(golden, version, **fields) -> EvalRun:
    """An eval run row written directly (no durable run): for lists and query budgets."""
    return EvalRun.objects.create(workspace_id=golden.workspace_id, golden_set=golden, workflow_version=version,
                                  **fields)


def add_results(run, count):
    items = list(run.golden_set.items.order_by("position"))
    for index in range(count):
        item = items[index] if index < len(items) else golden_item_add(golden_set=run.golden_set,
                                                                       input={"text": f"extra {index}"})
        GoldenResult.objects.create(eval_run=run, golden_item=item, workflow_version=run.workflow_version,
                                    score=(index % 10) / 10, passed=index % 10 >= 7, grader="contains",
                                    grading_rationale="r", reuse_key=f"{run.pk}-{index}")


# --------------------------------------------------------------------------------------- golden sets


def test_create_list_filter_change_and_delete_a_golden_set(api_as, owner, workspace):
    client = api_as(owner)
    version = new_version(workspace)
    created = client.post(SETS, {"workspace": workspace.pk, "name": "Support", "workflow": version.workflow_id,
                                 "description": "Refund questions", "pass_threshold": 0.8,
                                 "graders": [{"kind": "contains", "weight": 2}, {"kind": "token_f1"}]}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["item_count"] == 0 and body["created_by"] == "owner" and body["pass_threshold"] == 0.8
    assert body["graders"] == [{"kind": "contains", "weight": 2.0}, {"kind": "token_f1", "weight": 1.0}]
    assert body["items_url"].endswith(f"{ITEMS_URL}?golden_set={body['id']}")
    assert body["eval_runs_url"].endswith(f"{RUNS}?golden_set={body['id']}")
    default = client.post(SETS, {"workspace": workspace.pk, "name": "Other"}, format="json").json()
    assert default["graders"] == [{"kind": "llm_judge", "weight": 1.0}] and default["workflow"] is None
    golden_item_add(golden_set=GoldenSet.objects.get(pk=body["id"]), input="q")
    assert client.get(f"{SETS}{body['id']}/").json()["item_count"] == 1
    assert [s["name"] for s in client.get(SETS, {"q": "refund"}).json()["results"]] == ["Support"]
    assert [s["name"] for s in client.get(SETS, {"workflow": version.workflow_id}).json()["results"]] == ["Support"]
    assert len(client.get(SETS, {"workspace": workspace.pk}).json()["results"]) == 2
    assert "name" in error_of(client.post(SETS, {"workspace": workspace.pk, "name": "Support"}))["fields"]
    changed = client.patch(f"{SETS}{body['id']}/", {"name": "Support v2", "workspace": 987654, "pass_threshold": 1,
                                                    "graders": [{"kind": "exact"}]}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["workspace"] == workspace.pk and changed.json()["name"] == "Support v2"
    assert changed.json()["graders"] == [{"kind": "exact", "weight": 1.0, "case_sensitive": False}]
    assert changed.json()["item_count"] == 1
    assert client.delete(f"{SETS}{body['id']}/").status_code == 204
    assert not GoldenSet.objects.filter(pk=body["id"]).exists() and not GoldenItem.objects.exists()


@pytest.mark.parametrize(("payload", "field"), [
    ({"graders": [{"kind": "nonsense"}]}, "graders[0].kind"),
    ({"graders": [{"kind": "exact"}, {"kind": "regex", "pattern": "(?:ab|cd){1000000}"}]}, "graders[1].pattern"),
    ({"graders": [{"kind": "regex", "pattern": "("}]}, "graders[0].pattern"),
    ({"graders": [{"kind": "contains", "bogus": 1}]}, "graders[0].bogus"),
    ({"graders": [{"kind": "contains", "weight": 0}]}, "graders[0].weight"),
    ({"graders": [{"kind": "numeric", "tolerance": -1}]}, "graders[0].tolerance"),
    ({"graders": [{"kind": "json_schema", "schema": {"type": 5}}]}, "graders[0].schema"),
    # offline, any provider's model is answered by the offline model; a name with no provider is not a model
    ({"graders": [{"kind": "llm_judge", "model": "#x"}]}, "graders[0].model"),
    ({"graders": ["exact"]}, "graders[0]"),
    ({"graders": "exact"}, "graders"), ({"graders": []}, "graders"), ({"graders": [{"kind": "exact"}] * 11}, "graders"),
    ({"pass_threshold": 1.5}, "pass_threshold"), ({"pass_threshold": -0.1}, "pass_threshold"),
    ({"pass_threshold": "NaN"}, "pass_threshold"), ({"pass_threshold": "1e999"}, "pass_threshold"),
    ({"pass_threshold": [1]}, "pass_threshold"),
    ({"name": ""}, "name"), ({"name": "x" * 201}, "name"), ({"description": {"a": 1}}, "description"),
    ({"workspace": "abc"}, "workspace"), ({"workspace": 10**30}, "workspace"), ({"workflow": 10**30}, "workflow"),
    ({"workflow": "x"}, "workflow"),
])
def test_bad_golden_set_input_is_400_naming_the_field(api_as, owner, workspace, payload, field):
    body = {"workspace": workspace.pk, "name": "set", **payload}
    error = error_of(api_as(owner).post(SETS, body, format="json"))
    assert field in error["fields"], error
    assert not GoldenSet.objects.exists()


def test_a_golden_set_cannot_link_a_workflow_of_another_workspace(api_as, owner, workspace):
    second = WorkspaceFactory(name="Second", slug="second")
    MembershipFactory(user=owner, workspace=second, role=Membership.Role.OWNER)
    elsewhere = new_version(second)
    client = api_as(owner)
    error = error_of(client.post(SETS, {"workspace": workspace.pk, "name": "s", "workflow": elsewhere.workflow_id}))
    assert list(error["fields"]) == ["workflow"]
    golden = make_set(workspace)
    error = error_of(client.patch(f"{SETS}{golden.pk}/", {"workflow": elsewhere.workflow_id}, format="json"))
    assert list(error["fields"]) == ["workflow"]


# ------------------------------------------------------------------------------------------- scoping


@pytest.fixture
def theirs(other_workspace, outsider):
    """The outsider's golden set (an item), version, eval run (a result) and promotion."""
    golden = make_set(other_workspace, name="globex set")
    version = new_version(other_workspace, name="globex flow")
    run = make_run(golden, version, status=EvalRun.Status.COMPLETED)
    add_results(run, 1)
    promotion = Promotion.objects.create(workflow=version.workflow, workflow_version=version, action="promote",
                                         evidence={"note": "globex secret"})
    return {"set": golden, "item": golden.items.get(), "version": version, "run": run, "promotion": promotion}


def test_another_workspaces_rows_are_404_and_never_listed(api_as, owner, workspace, theirs):
    client = api_as(owner)
    mine = make_set(workspace)
    my_version = new_version(workspace)
    s, i, r, v = theirs["set"].pk, theirs["item"].pk, theirs["run"].pk, theirs["version"].pk
    for method, url in [
        ("get", f"{SETS}{s}/"), ("patch", f"{SETS}{s}/"), ("delete", f"{SETS}{s}/"), ("post", f"{SETS}{s}/import/"),
        ("get", f"{SETS}{s}/compare/?a={v}&b={v}"), ("get", f"{ITEMS_URL}{i}/"), ("patch", f"{ITEMS_URL}{i}/"),
        ("delete", f"{ITEMS_URL}{i}/"), ("get", f"{RUNS}{r}/"), ("get", f"{RUNS}{r}/results/"),
        ("post", f"{RUNS}{r}/cancel/"), ("post", f"{RUNS}{r}/rewrite/"),
        ("get", f"{PROMOTIONS}{theirs['promotion'].pk}/"), ("post", f"{VERSIONS}{v}/promote/"),
        ("post", f"{WORKFLOWS}{theirs['version'].workflow_id}/rollback/"),
    ]:
        body = {"name": "mine now", "golden_set": mine.pk, "items": [{"input": "x"}]}
        response = getattr(client, method)(url, body, format="json") if method in ("post", "patch") \
            else getattr(client, method)(url)
        assert error_of(response, 404)["code"] == "not_found", url
    for url in (SETS, ITEMS_URL, RUNS, PROMOTIONS):
        assert "globex" not in client.get(url).content.decode().lower(), url
    # naming their rows in a filter or a body is "not a valid choice", like a missing id
    for url, params in [(SETS, {"workflow": theirs["version"].workflow_id}), (ITEMS_URL, {"golden_set": s}),
                        (RUNS, {"golden_set": s}), (RUNS, {"workflow_version": v}),
                        (RUNS, {"workflow": theirs["version"].workflow_id}),
                        (PROMOTIONS, {"workflow": theirs["version"].workflow_id}),
                        (SETS, {"workspace": theirs["set"].workspace_id})]:
        assert list(error_of(client.get(url, params))["fields"]) == list(params), (url, params)
    for url, body, field in [
        (SETS, {"workspace": theirs["set"].workspace_id, "name": "x"}, "workspace"),
        (SETS, {"workspace": workspace.pk, "name": "x", "workflow": theirs["version"].workflow_id}, "workflow"),
        (ITEMS_URL, {"golden_set": s, "input": "x"}, "golden_set"),
        (RUNS, {"golden_set": s, "workflow_version": my_version.pk}, "golden_set"),
        (RUNS, {"golden_set": mine.pk, "workflow_version": v}, "workflow_version"),
        (f"{VERSIONS}{my_version.pk}/promote/", {"golden_set": s}, "golden_set"),
    ]:
        assert field in error_of(client.post(url, body, format="json"))["fields"], (url, body)
    assert error_of(client.get(f"{SETS}{mine.pk}/compare/", {"a": v, "b": my_version.pk}))["fields"] == {
        "a": [f"No version {v} in this golden set's workspace."]}
    assert theirs["set"].items.count() == 1 and EvalRun.objects.filter(golden_set=theirs["set"]).count() == 1


def test_an_eval_run_needs_a_version_of_the_sets_workspace(api_as, owner, workspace):
    """The caller belongs to both workspaces: the version is theirs to use, not on this set."""
    second = WorkspaceFactory(name="Second", slug="second")
    MembershipFactory(user=owner, workspace=second, role=Membership.Role.OWNER)
    golden = make_set(workspace)
    elsewhere = new_version(second)
    error = error_of(api_as(owner).post(RUNS, {"golden_set": golden.pk, "workflow_version": elsewhere.pk}))
    assert error["fields"] == {"workflow_version": ["belongs to another workspace"]}
    promote = api_as(owner).post(f"{VERSIONS}{elsewhere.pk}/promote/", {"golden_set": golden.pk})
    assert list(error_of(promote)["fields"]) == ["golden_set"]
    assert not EvalRun.objects.exists()


@pytest.mark.parametrize("suffix", ["abc", "99999999999999999999", "-1", "1.5", "%20"])
def test_a_malformed_or_huge_id_is_404(api_as, owner, suffix):
    client = api_as(owner)
    for collection in (SETS, ITEMS_URL, RUNS, PROMOTIONS):
        assert client.get(f"{collection}{suffix}/").status_code == 404, collection
    for url in (f"{RUNS}{suffix}/results/", f"{SETS}{suffix}/compare/"):
        assert client.get(url).status_code == 404, url
    for url in (f"{RUNS}{suffix}/cancel/", f"{RUNS}{suffix}/rewrite/", f"{SETS}{suffix}/import/",
                f"{VERSIONS}{suffix}/promote/", f"{WORKFLOWS}{suffix}/rollback/"):
        assert client.post(url, {}, format="json").status_code == 404, url


def test_any_member_writes_and_the_write_role_is_checked_on_every_write(api_as, workspace, monkeypatch):
    member = UserFactory(username="plain")
    MembershipFactory(user=member, workspace=workspace, role=Membership.Role.MEMBER)
    client = api_as(member)
    assert client.post(SETS, {"workspace": workspace.pk, "name": "by a member"}).status_code == 201
    golden = make_set(workspace, name="guarded")
    version = new_version(workspace)
    run = make_run(golden, version, status=EvalRun.Status.QUEUED)
    for viewset in (views.GoldenSetViewSet, views.GoldenItemViewSet, views.EvalRunViewSet,
                    views.VersionPromoteViewSet, views.WorkflowRollbackViewSet):
        monkeypatch.setattr(viewset, "write_roles", Membership.Role.MANAGERS)
    item = golden.items.get()
    writes = [
        ("post", SETS, {"workspace": workspace.pk, "name": "refused"}),
        ("patch", f"{SETS}{golden.pk}/", {"name": "refused"}), ("delete", f"{SETS}{golden.pk}/", None),
        ("post", f"{SETS}{golden.pk}/import/", {"items": [{"input": "q"}]}),
        ("post", ITEMS_URL, {"golden_set": golden.pk, "input": "q"}),
        ("patch", f"{ITEMS_URL}{item.pk}/", {"input": "changed"}), ("delete", f"{ITEMS_URL}{item.pk}/", None),
        ("post", RUNS, {"golden_set": golden.pk, "workflow_version": version.pk}),
        ("post", f"{RUNS}{run.pk}/cancel/", {}), ("post", f"{RUNS}{run.pk}/rewrite/", None),
        ("post", f"{VERSIONS}{version.pk}/promote/", {"golden_set": golden.pk}),
        ("post", f"{WORKFLOWS}{version.workflow_id}/rollback/", None),
    ]
    for method, url, body in writes:
        assert error_of(getattr(client, method)(url, body, format="json"), 403)["code"] == "permission_denied", url
    for url in (f"{SETS}{golden.pk}/", f"{ITEMS_URL}{item.pk}/", f"{RUNS}{run.pk}/", f"{RUNS}{run.pk}/results/"):
        assert client.get(url).status_code == 200, url
    assert GoldenSet.objects.get(pk=golden.pk).name == "guarded" and golden.items.count() == 1
    assert EvalRun.objects.get(pk=run.pk).status == "queued" and EvalRun.objects.count() == 1


# --------------------------------------------------------------------------------------------- items


def test_items_are_added_in_order_validated_and_changed(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    first = client.post(ITEMS_URL, {"golden_set": golden.pk, "input": {"text": "How long do refunds take?"},
                                    "expected_output": "Five days.", "tags": ["critical"],
                                    "rubric": [{"criterion": "mentions days", "max_points": 2}]}, format="json")
    assert first.status_code == 201, first.json()
    body = first.json()
    assert body["position"] == 1 and len(body["content_hash"]) == 64 and body["metadata"] == {}
    second = client.post(ITEMS_URL, {"golden_set": golden.pk, "input": "second"}, format="json").json()
    early = client.post(ITEMS_URL, {"golden_set": golden.pk, "input": "early", "position": 0}, format="json").json()
    assert second["position"] == 2 and early["position"] == 0
    listed = client.get(ITEMS_URL, {"golden_set": golden.pk}).json()["results"]
    assert [i["id"] for i in listed] == [early["id"], body["id"], second["id"]]
    assert [i["id"] for i in client.get(ITEMS_URL, {"tag": "critical"}).json()["results"]] == [body["id"]]
    page = client.get(ITEMS_URL, {"golden_set": golden.pk, "page_size": 2}).json()
    assert [i["id"] for i in client.get(page["next"]).json()["results"]] == [second["id"]]
    changed = client.patch(f"{ITEMS_URL}{body['id']}/", {"expected_output": "Five business days.",
                                                         "golden_set": 987654}, format="json")
    assert changed.status_code == 200 and changed.json()["golden_set"] == golden.pk
    assert changed.json()["content_hash"] != body["content_hash"]
    assert client.delete(f"{ITEMS_URL}{second['id']}/").status_code == 204
    assert golden.items.count() == 2


def test_items_have_a_split_the_list_filters_on_and_their_set_shows_its_plan(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    small = client.get(f"{SETS}{golden.pk}/").json()["split_plan"]
    assert small["held_out"] is False and small["reason"].startswith("The set has 0 items: a held-out split needs "
                                                                      "at least 12 (EVAL_MIN_SPLIT_ITEMS)")
    created = [client.post(ITEMS_URL, {"golden_set": golden.pk, "input": f"q{index}", "tags": ["topic"]},
                           format="json").json() for index in range(13)]
    held = client.post(ITEMS_URL, {"golden_set": golden.pk, "input": "chosen", "split": "test"}, format="json")
    assert held.status_code == 201 and held.json()["split"] == "test"
    by_split = {split: [item["id"] for item in [*created, held.json()] if item["split"] == split]
                for split in ("train", "validation", "test")}
    assert {split: len(ids) for split, ids in by_split.items()} == {"train": 7, "validation": 3, "test": 4}
    listed = client.get(ITEMS_URL, {"golden_set": golden.pk, "split": "test"}).json()["results"]
    assert [item["id"] for item in listed] == by_split["test"]
    both = client.get(ITEMS_URL, {"golden_set": golden.pk, "split": ["train", "validation"]}).json()["results"]
    assert sorted(item["id"] for item in both) == sorted(by_split["train"] + by_split["validation"])
    error = error_of(client.get(ITEMS_URL, {"split": "holdout"}))
    assert "split" in error["fields"]

    plan = client.get(f"{SETS}{golden.pk}/").json()["split_plan"]
    assert plan == {"held_out": True, "reason": "", "total": 14, "counts": {"train": 7, "validation": 3, "test": 4},
                    "min_items": 12, "min_per_split": 3, "proportions": {"train": 0.5, "validation": 0.25,
                                                                         "test": 0.25}}
    moved = by_split["validation"][0]
    assert client.patch(f"{ITEMS_URL}{moved}/", {"split": "train"}, format="json").json()["split"] == "train"
    plan = next(row for row in client.get(SETS).json()["results"] if row["id"] == golden.pk)["split_plan"]
    assert plan["held_out"] is False and plan["counts"]["validation"] == 2
    assert plan["reason"].startswith("the validation split has 2 items: each split needs at least 3")
    error = error_of(client.patch(f"{ITEMS_URL}{moved}/", {"split": "holdout"}, format="json"))
    assert "split" in error["fields"]


@pytest.mark.parametrize(("payload", "field"), [
    ({"input": MISSING}, "input"), ({"input": None}, "input"), ({"input": ""}, "input"), ({"input": {}}, "input"),
    ({"expected_output": {"a": 1}}, "expected_output"), ({"expected_output": "x" * 200_001}, "expected_output"),
    ({"scoring_criteria": ["x"]}, "scoring_criteria"), ({"rubric": [{"criterion": "x"}]}, "rubric"),
    ({"rubric": "be nice"}, "rubric"), ({"rubric": [{"criterion": "x", "max_points": 1e9}]}, "rubric"),
    ({"tags": "critical"}, "tags"), ({"tags": ["x" * 51]}, "tags"), ({"tags": [1]}, "tags"),
    ({"metadata": [1]}, "metadata"), ({"position": -1}, "position"), ({"position": 2**40}, "position"),
    ({"split": "holdout"}, "split"), ({"split": ["test"]}, "split"),
    ({"golden_set": "x"}, "golden_set"), ({"golden_set": 10**30}, "golden_set"), ({"golden_set": None}, "golden_set"),
])
def test_bad_item_input_is_400_naming_the_field(api_as, owner, workspace, payload, field):
    golden = make_set(workspace, items=0)
    body = {name: value for name, value in {"golden_set": golden.pk, "input": "q", **payload}.items()
            if value is not MISSING}
    error = error_of(api_as(owner).post(ITEMS_URL, body, format="json"))
    assert field in error["fields"], error
    assert not GoldenItem.objects.exists()


def test_an_input_json_cannot_store_is_400_naming_it(api_as, owner, workspace):
    golden = make_set(workspace, items=0)
    raw = json.dumps({"golden_set": golden.pk, "input": {"n": [1, 2]}}).replace("2]", "1e999]")
    error = error_of(api_as(owner).post(ITEMS_URL, raw, content_type="application/json"))
    assert list(error["fields"]) == ["input"]


def test_items_do_not_change_under_a_running_eval_run(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=2)
    run = make_run(golden, new_version(workspace), status=EvalRun.Status.RUNNING)
    item = golden.items.first()
    for response in (client.patch(f"{ITEMS_URL}{item.pk}/", {"input": "changed"}, format="json"),
                     client.delete(f"{ITEMS_URL}{item.pk}/"), client.delete(f"{SETS}{golden.pk}/")):
        assert "in progress" in error_of(response, 409)["message"]
    assert GoldenItem.objects.get(pk=item.pk).input == {"text": "q0"}
    EvalRun.objects.filter(pk=run.pk).update(status=EvalRun.Status.COMPLETED)
    assert client.patch(f"{ITEMS_URL}{item.pk}/", {"input": "changed"}, format="json").status_code == 200


def test_a_golden_set_other_rows_protect_is_409_not_a_500(api_as, owner, workspace, monkeypatch):
    """An evolution run keeps its golden set (on_delete=PROTECT): deleting the set is a conflict."""
    from django.db.models import ProtectedError

    golden = make_set(workspace)

    def protected(self, *args, **kwargs):
        raise ProtectedError("protected", {EvalRun(pk=1)})

    monkeypatch.setattr(GoldenSet, "delete", protected)
    error = error_of(api_as(owner).delete(f"{SETS}{golden.pk}/"), 409)
    assert error["message"] == f"Golden set {golden.pk} is used by eval runs; their history keeps it, so it cannot " \
                               "be deleted."


# -------------------------------------------------------------------------------------------- import


def _import(client, golden, content, content_type="application/jsonl", **params):
    query = "&".join(f"{key}={value}" for key, value in params.items())
    url = f"{SETS}{golden.pk}/import/" + (f"?{query}" if query else "")
    data = content.encode() if isinstance(content, str) else content
    return client.post(url, data=data, content_type=content_type)


def _upload(client, golden, name, content, **params):
    from django.core.files.uploadedfile import SimpleUploadedFile

    query = "&".join(f"{key}={value}" for key, value in params.items())
    data = content.encode() if isinstance(content, str) else content
    return client.post(f"{SETS}{golden.pk}/import/" + (f"?{query}" if query else ""),
                       {"file": SimpleUploadedFile(name, data)}, format="multipart")


def _items(golden):
    return list(GoldenItem.objects.filter(golden_set=golden).order_by("position")
                .values("position", "input", "expected_output", "scoring_criteria", "rubric", "tags", "metadata"))


JSONL = "\n".join([
    json.dumps({"input": {"text": "How long do refunds take?"}, "expected_output": "Five business days.",
                "tags": ["critical"], "rubric": [{"criterion": "names the delay", "max_points": 2}]}),
    "",
    json.dumps({"input": "When do orders ship?", "expected_output": {"days": 2}, "tags": "shipping, fast",
                "metadata": {"source": "faq"}, "scoring_criteria": "States the delay."}),
    json.dumps({"input": "How much?", "expected_output": 12}),
]) + "\n"


def test_a_jsonl_file_is_imported_after_the_existing_items(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=1)
    response = _import(client, golden, JSONL)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["created"] == 3 and body["errors"] == [] and len(body["items"]) == 3
    assert body["items_url"].endswith(f"{ITEMS_URL}?golden_set={golden.pk}")
    items = _items(golden)
    assert [i["position"] for i in items] == [1, 2, 3, 4]
    assert items[1]["rubric"] == [{"criterion": "names the delay", "max_points": 2}]
    assert items[1]["tags"] == ["critical"]
    assert items[2] == {"position": 3, "input": "When do orders ship?", "expected_output": '{"days": 2}',
                        "scoring_criteria": "States the delay.", "rubric": [], "tags": ["shipping", "fast"],
                        "metadata": {"source": "faq"}}
    assert items[3]["expected_output"] == "12"
    # the same file as an upload, and as ndjson: the same items again, after them
    assert _upload(client, golden, "more.jsonl", JSONL).json()["created"] == 3
    assert _import(client, golden, JSONL, content_type="application/x-ndjson").json()["created"] == 3
    assert [i["position"] for i in _items(golden)] == list(range(1, 11))


def test_bad_jsonl_lines_refuse_the_file_with_their_line_numbers(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    lines = [
        json.dumps({"input": "fine"}),
        json.dumps({"expected_output": "no input"}),
        "{not json",
        "",
        json.dumps(["a", "list"]),
        json.dumps({"input": "q", "rubric": "be nice", "tags": [1], "metadata": [1], "colour": "red"}),
        json.dumps({"input": "q\u0000", "scoring_criteria": 5}),
        '{"input": "q", "expected_output": NaN}',
        '{"input": {"n": 1e999}}',
        json.dumps({"input": "q", "expected_output": "x" * 200_001}),
        "[" * 5000 + "]" * 5000,
    ]
    error = error_of(_import(client, golden, "\n".join(lines)))
    by_line = {entry["line"]: entry["fields"] for entry in error["errors"]}
    assert sorted(by_line) == [2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert by_line[2] == {"input": ["is required"]}
    assert list(by_line[3]) == ["line"] and by_line[3]["line"][0].startswith("is not valid JSON")
    assert by_line[5] == {"line": ["must be a JSON object with an `input` key"]}
    assert set(by_line[6]) == {"rubric", "tags", "metadata", "colour"}
    assert by_line[6]["colour"][0].startswith("unknown key; known: input, expected_output")
    assert by_line[7] == {"input": ["Null characters are not allowed."], "scoring_criteria": ["must be text"]}
    assert "NaN is not a JSON number" in by_line[8]["line"][0]
    assert "out of range" in by_line[9]["line"][0]
    assert by_line[10] == {"expected_output": ["at most 200,000 characters"]}
    assert "nested too deeply" in by_line[11]["line"][0]
    assert error["message"].startswith("9 lines with errors, nothing was imported: line 2: input: is required")
    assert error["fields"]["file"][0] == "line 2: input: is required"
    assert not GoldenItem.objects.exists()


def test_partial_writes_the_good_lines_and_reports_the_bad(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    content = "\n".join([json.dumps({"input": "one"}), json.dumps({"input": ""}), json.dumps({"input": "three"})])
    response = _import(client, golden, content, partial=1)
    assert response.status_code == 201, response.json()
    assert response.json()["created"] == 2
    assert response.json()["errors"] == [{"line": 2, "fields": {"input": ["is required"]}}]
    assert [i["input"] for i in _items(golden)] == ["one", "three"]
    # nothing good at all: refused, even with partial
    assert error_of(_import(client, golden, json.dumps({"input": ""}), partial="true"))["errors"][0]["line"] == 1
    assert error_of(_import(client, golden, content, partial="maybe"))["fields"] == {
        "partial": ["Must be true or false (1 or 0)."]}
    assert error_of(_import(client, golden, content, partial=0))["errors"][0]["line"] == 2
    assert len(_items(golden)) == 2


CSV = (
    "\ufeffInput,expected_output,tags,rubric,metadata,scoring_criteria\r\n"
    "How long do refunds take?,Five business days.,\"critical, refunds\",,,\r\n"
    "\r\n"
    "\"A question\nover two lines\",\"An answer, with a comma\",\"[\"\"json\"\", \"\"tags\"\"]\","
    "\"[{\"\"criterion\"\": \"\"cites\"\", \"\"max_points\"\": 1}]\",\"{\"\"k\"\": 1}\",Be brief.\r\n"
    "\"{\"\"text\"\": \"\"an object input\"\"}\",ok,,,,\r\n"
)


def test_a_csv_file_is_imported_with_a_bom_quoted_lines_and_json_cells(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    response = _import(client, golden, CSV, content_type="text/csv")
    assert response.status_code == 201, response.json()
    items = _items(golden)
    assert items[0] == {"position": 1, "input": "How long do refunds take?", "expected_output": "Five business days.",
                        "scoring_criteria": "", "rubric": [], "tags": ["critical", "refunds"], "metadata": {}}
    assert items[1] == {"position": 2, "input": "A question\nover two lines",
                        "expected_output": "An answer, with a comma", "scoring_criteria": "Be brief.",
                        "rubric": [{"criterion": "cites", "max_points": 1}], "tags": ["json", "tags"],
                        "metadata": {"k": 1}}
    assert items[2]["input"] == {"text": "an object input"}
    assert _upload(client, golden, "items.csv", CSV).json()["created"] == 3
    assert _upload(client, golden, "no-extension", CSV).json()["created"] == 3  # read as CSV: not a JSON object


def test_bad_csv_rows_are_reported_with_the_line_they_start_on(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    content = ("input,expected_output,rubric,tags,metadata\n"
               "fine,ok,,,\n"
               "\"two\nlines\",ok,not json,,\n"
               ",no input,,,\n"
               "a,b\n"
               "q,ok,,\"[1]\",\"[1]\"\n"
               "q\u0000,ok,,,\n"
               "q,ok,[1e999],,\n")
    error = error_of(_import(client, golden, content, content_type="text/csv"))
    by_line = {entry["line"]: entry["fields"] for entry in error["errors"]}
    assert sorted(by_line) == [3, 5, 6, 7, 8, 9]
    assert by_line[3] == {"rubric": ["is not valid JSON: Expecting value: line 1 column 1 (char 0)"]}
    assert by_line[5] == {"input": ["is required"]}
    assert by_line[6] == {"row": ["has 2 cells; the header has 5 columns"]}
    assert set(by_line[7]) == {"tags", "metadata"}
    assert by_line[8] == {"input": ["Null characters are not allowed."]}
    assert "out of range" in by_line[9]["rubric"][0]
    assert not GoldenItem.objects.exists()


@pytest.mark.parametrize(("content", "message"), [
    ("question,answer\nq,a\n", "Unknown CSV column(s) 'question', 'answer'"),
    ("expected_output\na\n", "The CSV header has no `input` column."),
    ("input,Input\na,b\n", "The CSV header repeats input."),
    ("input\n\"unterminated\n", None),
])
def test_an_unreadable_csv_header_or_record_is_a_400_on_the_file(api_as, owner, workspace, content, message):
    golden = make_set(workspace, items=0)
    response = _import(api_as(owner), golden, content, content_type="text/csv")
    if message is None:  # an unterminated quote runs to the end of the file: one record, no error
        assert response.status_code in (201, 400)
        return
    assert error_of(response)["fields"]["file"][0].startswith(message)
    assert not GoldenItem.objects.exists()


@pytest.mark.parametrize(("content", "message"), [
    ("input\nR\xe9sum\xe9\n".encode("latin-1"), "The file is not UTF-8 text: byte 0xe9 on line 2 cannot be read"),
    ("input\nq\n".encode("utf-16"), "The file is UTF-16 text; save it as UTF-8."),
    (b"\n\n\x00\xff", "The file is not UTF-8 text: byte 0xff on line 3"),
    (b"   \n\n", "The file has no items."),
    (b"input\n", "The file has no items."),
])
def test_an_undecodable_or_empty_file_is_a_400_on_the_file(api_as, owner, workspace, content, message):
    golden = make_set(workspace, items=0)
    for response in (_import(api_as(owner), golden, content, content_type="text/csv"),
                     _upload(api_as(owner), golden, "items.csv", content)):
        assert error_of(response)["fields"]["file"][0].startswith(message)
    assert not GoldenItem.objects.exists()


def test_an_import_without_a_file_or_with_a_json_body(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    url = f"{SETS}{golden.pk}/import/"
    for response in (client.post(url), client.post(url, {"other": "x"}, format="multipart"),
                     client.post(url, "a=1", content_type="application/x-www-form-urlencoded")):
        assert "file" in error_of(response)["fields"]
    assert error_of(client.post(f"{SETS}{golden.pk}/import/", "x", content_type="application/pdf"), 415)
    items = [{"input": "one", "tags": ["a"]}, "not an object", {"input": {}}]
    error = error_of(client.post(f"{SETS}{golden.pk}/import/", {"items": items}, format="json"))
    assert error["errors"] == [{"line": 2, "fields": {"line": ["must be a JSON object"]}},
                               {"line": 3, "fields": {"input": ["is required"]}}]
    assert "items" in error["fields"]
    response = client.post(f"{SETS}{golden.pk}/import/?partial=1", {"items": items}, format="json")
    assert response.status_code == 201 and response.json()["created"] == 1
    for body in ({"items": "x"}, {"items": [{"input": "x"}] * 5001}, {}):
        assert "items" in error_of(client.post(f"{SETS}{golden.pk}/import/", body, format="json"))["fields"]


def test_the_import_limits_are_413_with_a_message(api_as, owner, workspace):
    client = api_as(owner)
    golden = make_set(workspace, items=0)
    lines = "\n".join(json.dumps({"input": f"q{n}"}) for n in range(5001))
    error = error_of(_import(client, golden, lines), 413)
    assert error["message"] == "The file has more than 5,000 items; split it." and error["code"] == "too_large"
    big = "input\n" + "x" * (5 * 1024 * 1024)
    assert "over the 5,242,880-byte limit" in error_of(_import(client, golden, big, content_type="text/csv"),
                                                       413)["message"]
    assert "over the 5,242,880-byte limit" in error_of(_upload(client, golden, "big.csv", big), 413)["message"]
    assert not GoldenItem.objects.exists()
    assert _import(client, golden, "\n".join(lines.split("\n")[:5000])).json()["created"] == 5000


def test_a_set_holds_at_most_eval_max_items_per_set_items(api_as, owner, workspace, settings):
    """Each comparison of a set holds its items' scores in the web process: the set's size is capped, on item
    create and on import (all or nothing), with a 400 naming the field."""
    settings.EVAL_MAX_ITEMS_PER_SET = 3
    client = api_as(owner)
    golden = make_set(workspace, items=2)
    lines = "\n".join(json.dumps({"input": f"q{n}"}) for n in range(2))
    error = error_of(_import(client, golden, lines))
    assert "file" in error["fields"] and "at most 3 items" in error["message"] and "has 2" in error["message"]
    error = error_of(client.post(f"{SETS}{golden.pk}/import/", {"items": [{"input": "x"}] * 2}, format="json"))
    assert "items" in error["fields"] and "EVAL_MAX_ITEMS_PER_SET" in error["message"]
    csv_error = error_of(_upload(client, golden, "more.csv", "input\nx\ny\n"))
    assert "file" in csv_error["fields"]
    assert GoldenItem.objects.filter(golden_set=golden).count() == 2
    assert client.post(ITEMS_URL, {"golden_set": golden.pk, "input": "third"}, format="json").status_code == 201
    error = error_of(client.post(ITEMS_URL, {"golden_set": golden.pk, "input": "fourth"}, format="json"))
    assert "golden_set" in error["fields"] and "at most 3 items" in error["message"]
    assert GoldenItem.objects.filter(golden_set=golden).count() == 3


# ----------------------------------------------------------------------------------------- eval runs


def test_starting_an_eval_run_answers_202_and_a_refused_start_400(api_as, owner, workspace, support_set,
                                                                 support_versions):
    client = api_as(owner)
    base, _ = support_versions
    response = client.post(RUNS, {"golden_set": support_set.pk, "workflow_version": base.pk, "reuse": False,
                                  "concurrency": 2}, format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "queued" and body["reuse"] is False and body["config"]["concurrency"] == 2
    assert body["workflow"] == base.workflow_id and body["origin"] == "manual" and body["created_by"] == "owner"
    assert body["durable_run"] == f"eval-{body['id']}"
    assert body["durable_run_url"].endswith(f"/api/durable/runs/eval-{body['id']}/")
    assert client.get(body["durable_run_url"]).json()["workflow"] == "evals.run"
    assert body["histogram"][0] == {"low": 0.0, "high": 0.1, "count": 0} and len(body["histogram"]) == 10
    for params in ({"golden_set": support_set.pk}, {"workflow_version": base.pk}, {"workflow": base.workflow_id},
                   {"status": "queued"}, {"origin": "manual"}, {}):
        assert [r["id"] for r in client.get(RUNS, params).json()["results"]] == [body["id"]], params
    assert client.get(RUNS, {"status": ["completed", "failed"]}).json()["results"] == []
    empty = make_set(workspace, name="empty", items=0)
    error = error_of(client.post(RUNS, {"golden_set": empty.pk, "workflow_version": base.pk}))
    assert error["fields"] == {"golden_set": ["has no items"]}
    lacking = new_version(workspace, name="lacking")
    lacking, _ = workflow_version_create(workflow=lacking.workflow, dsl=graph("a", node("a", tools=["tavily"])))
    error = error_of(client.post(RUNS, {"golden_set": support_set.pk, "workflow_version": lacking.pk}))
    assert "tools" in error["fields"]
    assert EvalRun.objects.count() == 1


@pytest.mark.parametrize(("payload", "field"), [
    ({"concurrency": 0}, "concurrency"), ({"concurrency": 1025}, "concurrency"), ({"concurrency": "x"}, "concurrency"),
    ({"concurrency": 10**30}, "concurrency"), ({"reuse": "maybe"}, "reuse"), ({"node_budget": 0}, "node_budget"),
    ({"usd_budget": "NaN"}, "usd_budget"), ({"usd_budget": -1}, "usd_budget"), ({"golden_set": None}, "golden_set"),
    ({"workflow_version": "abc"}, "workflow_version"), ({"workflow_version": [1]}, "workflow_version"),
])
def test_bad_eval_run_input_is_400_naming_the_field(api_as, owner, workspace, payload, field):
    golden = make_set(workspace)
    version = new_version(workspace)
    body = {"golden_set": golden.pk, "workflow_version": version.pk, **payload}
    assert field in error_of(api_as(owner).post(RUNS, body, format="json"))["fields"]
    assert not EvalRun.objects.exists()


def test_cancel_a_queued_eval_run_then_409(api_as, owner, workspace):
    client = api_as(owner)
    run = eval_run_start(golden_set=make_set(workspace), version=new_version(workspace))
    cancelled = client.post(f"{RUNS}{run.pk}/cancel/", {"reason": "not needed"}, format="json")
    assert cancelled.status_code == 200, cancelled.json()
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["error"] == "not needed"
    assert "is cancelled" in error_of(client.post(f"{RUNS}{run.pk}/cancel/"), 409)["message"]
    assert "completed run" in error_of(client.post(f"{RUNS}{run.pk}/rewrite/"), 409)["message"]
    assert "reason" in error_of(client.post(f"{RUNS}{run.pk}/cancel/", {"reason": "x" * 501}))["fields"]


def test_an_eval_run_driven_to_its_end_shows_results_and_a_histogram(api_as, owner, facts, support_set,
                                                                     support_versions):
    from durable.inprocess import run_until_settled

    client = api_as(owner)
    _, better = support_versions
    started = client.post(RUNS, {"golden_set": support_set.pk, "workflow_version": better.pk}, format="json").json()
    run_until_settled(started["durable_run"], max_wait=60)
    detail = client.get(f"{RUNS}{started['id']}/").json()
    assert detail["status"] == "completed", detail["error"]
    assert detail["items_total"] == detail["items_done"] == 6 and detail["grading_errors"] == 0
    assert 0 < detail["avg_score"] <= 1 and detail["fitness"] > 0 and detail["latency_p95_ms"] is not None
    assert sum(b["count"] for b in detail["histogram"]) == 6
    assert detail["config"]["graders"][0]["kind"] == "contains"
    results = client.get(detail["results_url"]).json()["results"]
    positions = list(support_set.items.order_by("position").values_list("pk", flat=True))
    assert [r["item"] for r in results] == positions
    first = results[0]
    assert first["grader"] == "contains+token_f1" and first["grades"] and first["rationale"]
    assert first["workflow_invocation_url"].endswith(f"/api/workflow-invocations/{first['workflow_invocation']}/")
    assert client.get(first["workflow_invocation_url"]).json()["status"] == "completed"
    assert first["item_url"].endswith(f"{ITEMS_URL}{first['item']}/") and first["reused_from"] is None
    passed = [r["item"] for r in results if r["passed"]]
    assert [r["item"] for r in client.get(detail["results_url"], {"passed": "true"}).json()["results"]] == passed
    assert client.get(detail["results_url"], {"grading_error": "true"}).json()["results"] == []
    page = client.get(detail["results_url"], {"page_size": 4}).json()
    assert [r["item"] for r in page["results"] + client.get(page["next"]).json()["results"]] == positions
    for params, field in [({"passed": "perhaps"}, "passed"), ({"grading_error": "2"}, "grading_error"),
                          ({"cursor": "garbage"}, "cursor"),
                          ({"page_size": 0}, "page_size")]:
        assert field in error_of(client.get(detail["results_url"], params))["fields"], params
    # run again: every result reused and linked to the one it copies
    again = client.post(RUNS, {"golden_set": support_set.pk, "workflow_version": better.pk}, format="json").json()
    run_until_settled(again["durable_run"], max_wait=60)
    reused = client.get(f"{RUNS}{again['id']}/results/").json()["results"]
    assert [r["reused_from"] for r in reused] == [r["id"] for r in results]


def test_compare_two_versions_on_a_set(api_as, owner, workspace, facts, support_set, support_versions, evaluate):
    client = api_as(owner)
    base, better = support_versions
    url = f"{SETS}{support_set.pk}/compare/"
    assert error_of(client.get(url, {"a": base.pk, "b": better.pk}))["fields"] == {"versions": [
        f"version {base.pk} has no completed eval run on this set",
        f"version {better.pk} has no completed eval run on this set"]}
    base_run, better_run = evaluate(support_set, base), evaluate(support_set, better)
    response = client.get(url, {"a": base.pk, "b": better.pk})
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["eval_run_a"] == base_run.pk and body["eval_run_b"] == better_run.pk
    comparison = body["comparison"]
    assert comparison["verdict"] == "better" and comparison["n"] == 6 and comparison["p_value"] < 0.05
    assert comparison["ci_low"] <= comparison["mean_diff"] <= comparison["ci_high"]
    assert [row["item"] for row in body["items"]] == list(support_set.items.order_by("position")
                                                          .values_list("pk", flat=True))
    assert body["critical_regressions"] == []
    assert client.get(url, {"a": better.pk, "b": base.pk}).json()["comparison"]["verdict"] == "worse"
    for params, field in [({"b": base.pk}, "a"), ({"a": "x", "b": 1}, "a"), ({"a": base.pk, "b": "1.5"}, "b"),
                          ({"a": base.pk, "b": 10**12}, "b"), ({"a": base.pk, "b": 987654}, "b")]:
        assert field in error_of(client.get(url, params))["fields"], params


def test_promote_then_a_refused_promotion_then_rollback(api_as, owner, workspace, facts, support_set,
                                                        support_versions, evaluate):
    client = api_as(owner)
    base, better = support_versions
    workflow_version_activate(version=base)
    evaluate(support_set, base)
    evaluate(support_set, better)
    # a worse candidate is refused with the evidence, and nothing changes
    worse, _ = workflow_version_create(workflow=base.workflow, dsl=graph("agent", node("agent", prompt="Be vague.")))
    evaluate(support_set, worse)
    refused = client.post(f"{VERSIONS}{worse.pk}/promote/", {"golden_set": support_set.pk}, format="json")
    error = error_of(refused, 409)
    assert error["code"] == "promotion_refused" and error["message"].startswith("promotion: the candidate is not")
    assert error["evidence"]["comparison"]["verdict"] in ("worse", "no significant difference")
    assert error["evidence"]["version_a"] == base.pk and error["evidence"]["version_b"] == worse.pk
    assert WorkflowVersion.objects.get(pk=base.pk).status == "active"
    promoted = client.post(f"{VERSIONS}{better.pk}/promote/", {"golden_set": support_set.pk}, format="json")
    assert promoted.status_code == 200, promoted.json()
    body = promoted.json()
    assert body["action"] == "promote" and body["workflow_version"] == better.pk and body["previous_version"] == base.pk
    assert body["evidence"]["comparison"]["verdict"] == "better" and body["decided_by"] == "owner"
    assert client.get(f"{VERSIONS}{better.pk}/").json()["status"] == "active"
    error = error_of(client.post(f"{VERSIONS}{better.pk}/promote/", {"golden_set": support_set.pk}, format="json"))
    assert error["fields"] == {"workflow_version": ["is already the active version"]}
    assert "golden_set" in error_of(client.post(f"{VERSIONS}{better.pk}/promote/", {}, format="json"))["fields"]
    rolled = client.post(f"{WORKFLOWS}{base.workflow_id}/rollback/")
    assert rolled.status_code == 200, rolled.json()
    assert rolled.json()["action"] == "rollback" and rolled.json()["workflow_version"] == base.pk
    assert client.get(f"{VERSIONS}{base.pk}/").json()["status"] == "active"
    listed = client.get(PROMOTIONS, {"workflow": base.workflow_id}).json()["results"]
    assert [(p["action"], p["workflow_version"]) for p in listed] == [("rollback", base.pk), ("promote", better.pk)]
    assert [p["id"] for p in client.get(PROMOTIONS, {"action": "promote"}).json()["results"]] == [body["id"]]
    assert client.get(f"{PROMOTIONS}{body['id']}/").json()["evidence"] == body["evidence"]


def test_rollback_with_no_earlier_active_version_is_409(api_as, owner, workspace):
    version = new_version(workspace)
    error = error_of(api_as(owner).post(f"{WORKFLOWS}{version.workflow_id}/rollback/"), 409)
    assert "no earlier active version" in error["message"]
    assert not Promotion.objects.exists()


def test_the_first_promotion_of_a_workflow_needs_the_candidates_own_run(api_as, owner, workspace, facts, support_set,
                                                                         support_versions, evaluate):
    client = api_as(owner)
    _, better = support_versions
    error = error_of(client.post(f"{VERSIONS}{better.pk}/promote/", {"golden_set": support_set.pk}, format="json"))
    assert error["fields"] == {"workflow_version": ["has no completed eval run on this set"]}
    evaluate(support_set, better)
    promoted = client.post(f"{VERSIONS}{better.pk}/promote/", {"golden_set": support_set.pk}, format="json").json()
    assert promoted["evidence"]["first_version"] is True and promoted["previous_version"] is None


def test_rewrite_creates_a_candidate_from_the_runs_failures(api_as, owner, workspace, facts, support_set, evaluate):
    client = api_as(owner)
    base = new_version(workspace, name="solo", prompt="You are a helpful support agent.")
    run = evaluate(support_set, base)
    response = client.post(f"{RUNS}{run.pk}/rewrite/")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["created"] is True and body["skipped"] == "" and body["rewriter"] == "offline-rules"
    assert body["node_id"] == "a" and body["confidence"] >= 0.3 and body["changelog"]
    candidate = WorkflowVersion.objects.get(pk=body["version"])
    assert body["version_url"].endswith(f"{VERSIONS}{candidate.pk}/")
    assert candidate.operation == "mutation" and candidate.parent1_id == base.pk and candidate.created_by == owner
    assert "knowledge_search" in candidate.dsl["nodes"][0]["codeTools"]
    again = client.post(f"{RUNS}{run.pk}/rewrite/")
    assert again.status_code == 200 and again.json()["version"] == candidate.pk and again.json()["created"] is False
    # a run with nothing failing: nothing to learn from
    GoldenResult.objects.filter(eval_run=run).update(passed=True)
    skipped = client.post(f"{RUNS}{run.pk}/rewrite/")
    assert skipped.status_code == 200
    assert skipped.json()["skipped"] == "no failing item to learn from" and skipped.json()["version"] is None
    assert skipped.json()["version_url"] is None


# ------------------------------------------------------------------------------------------- routes


def test_the_lifecycle_routes_live_in_the_workflows_url_space_without_colliding():
    from workflows.api.urls import router

    assert resolve("/api/workflow-versions/5/promote/").func.cls is views.VersionPromoteViewSet
    assert resolve("/api/workflows/5/rollback/").func.cls is views.WorkflowRollbackViewSet
    workflow_routes = {pattern.name for pattern in router.urls}
    assert not workflow_routes & {"workflow-version-promote", "workflow-rollback"}
    assert resolve("/api/workflow-versions/5/activate/").url_name == "workflow-version-activate"
    assert resolve("/api/workflows/5/versions/").url_name == "workflow-versions"


def test_the_schema_documents_the_evals_endpoints(api_as, owner):
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert [m for m in [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache] if "eval" in m.lower()
            or "golden" in m.lower() or "promot" in m.lower()] == []
    paths = api_as(owner).get("/api/schema/?format=json").json()["paths"]
    assert {"/api/golden-sets/", "/api/golden-sets/{id}/", "/api/golden-sets/{id}/import/",
            "/api/golden-sets/{id}/compare/", "/api/golden-items/", "/api/golden-items/{id}/", "/api/eval-runs/",
            "/api/eval-runs/{id}/", "/api/eval-runs/{id}/cancel/", "/api/eval-runs/{id}/results/",
            "/api/eval-runs/{id}/rewrite/", "/api/promotions/", "/api/promotions/{id}/",
            "/api/workflow-versions/{id}/promote/", "/api/workflows/{id}/rollback/"} <= set(paths)
    assert set(paths) == set(schema["paths"])
    guide = paths["/api/golden-sets/"]["post"]["description"]  # the graders' documentation, evals/graders/guide.md
    assert all(f"### `{kind}`" in guide for kind in GRADER_KINDS) and "EVAL_REGEX_TIMEOUT_SECONDS" in guide
    assert set(paths["/api/golden-sets/{id}/import/"]["post"]["requestBody"]["content"]) == {
        "multipart/form-data", "application/json", "text/csv", "application/jsonl"}
    assert {p["name"] for p in paths["/api/eval-runs/"]["get"]["parameters"]} >= {
        "golden_set", "workflow_version", "workflow", "status", "origin", "cursor"}
    assert {p["name"] for p in paths["/api/eval-runs/{id}/results/"]["get"]["parameters"]} >= {
        "passed", "grading_error", "cursor"}


# ------------------------------------------------------------------------------------ query budgets


def _sets(workspace, n):
    for _ in range(n):
        make_set(workspace, name=f"set {GoldenSet.objects.count()}", items=2)


def _items_rows(workspace, n):
    golden = GoldenSet.objects.filter(workspace=workspace).first() or make_set(workspace, items=0)
    for index in range(n):
        golden_item_add(golden_set=golden, input={"text": f"q{index}"})


def _runs(workspace, n):
    golden = GoldenSet.objects.filter(workspace=workspace).first() or make_set(workspace)
    version = WorkflowVersion.objects.filter(workflow__workspace=workspace).first() or new_version(workspace)
    for _ in range(n):
        run = make_run(golden, version, status=EvalRun.Status.COMPLETED, durable_run_id=None)
        add_results(run, 1)


def _promotions(workspace, n):
    version = WorkflowVersion.objects.filter(workflow__workspace=workspace).first() or new_version(workspace)
    for _ in range(n):
        Promotion.objects.create(workflow=version.workflow, workflow_version=version, action="promote",
                                 decided_by=None, evidence={"n": n})


# list url, how to add rows, the most queries it may take (scoping and the page, in one statement)
LISTS = [(SETS, _sets, 1), (ITEMS_URL, _items_rows, 1), (RUNS, _runs, 1), (PROMOTIONS, _promotions, 1)]


@pytest.mark.parametrize(("url", "make", "budget"), LISTS)
def test_list_endpoints_cost_the_same_for_1_and_50_rows(api_as, owner, workspace, url, make, budget,
                                                        django_assert_max_num_queries):
    client = api_as(owner)
    make(workspace, 1)
    one, _ = _count(client, url)
    make(workspace, 49)
    many, response = _count(client, url)
    assert len(response.json()["results"]) == 50
    assert many == one
    with django_assert_max_num_queries(budget):
        client.get(url)


def test_details_and_results_cost_the_same_for_1_and_40_results(api_as, owner, workspace,
                                                                django_assert_max_num_queries):
    client = api_as(owner)
    version = new_version(workspace)
    small, wide = make_set(workspace, name="small", items=1), make_set(workspace, name="wide", items=40)
    few_run, many_run = make_run(small, version), make_run(wide, version)
    add_results(few_run, 1)
    add_results(many_run, 40)
    promotion = Promotion.objects.create(workflow=version.workflow, workflow_version=version, action="promote")
    pairs = [(f"{SETS}{small.pk}/", f"{SETS}{wide.pk}/", 1),
             (f"{ITEMS_URL}{small.items.get().pk}/", f"{ITEMS_URL}{wide.items.last().pk}/", 1),
             (f"{RUNS}{few_run.pk}/", f"{RUNS}{many_run.pk}/", 2),  # the run, then its histogram
             (f"{RUNS}{few_run.pk}/results/", f"{RUNS}{many_run.pk}/results/", 2),  # the run, then the page
             (f"{PROMOTIONS}{promotion.pk}/", f"{PROMOTIONS}{promotion.pk}/", 1)]
    for few_url, many_url, budget in pairs:
        few, _ = _count(client, few_url)
        many, _ = _count(client, many_url)
        assert few == many, (few_url, few, many)
        with django_assert_max_num_queries(budget):
            client.get(many_url)
    assert len(client.get(f"{RUNS}{many_run.pk}/results/").json()["results"]) == 40
    assert sum(b["count"] for b in client.get(f"{RUNS}{many_run.pk}/").json()["histogram"]) == 40


def test_compare_costs_the_same_for_few_and_many_items(api_as, owner, workspace, django_assert_max_num_queries):
    client = api_as(owner)
    a, b = new_version(workspace, name="a"), new_version(workspace, name="b")
    costs = []
    for name, count in (("few", 2), ("many", 40)):
        golden = make_set(workspace, name=name, items=count)
        for version in (a, b):
            add_results(make_run(golden, version, status=EvalRun.Status.COMPLETED), count)
        queries, response = _count(client, f"{SETS}{golden.pk}/compare/", {"a": a.pk, "b": b.pk})
        assert len(response.json()["items"]) == count
        costs.append(queries)
    assert costs[0] == costs[1]
    # the set, two versions, two runs, per run its current scores (the set, item hashes, results), the items
    with django_assert_max_num_queries(12):
        client.get(f"{SETS}{golden.pk}/compare/", {"a": a.pk, "b": b.pk})



def test_the_browsable_api_renders_every_evals_page(api_as, owner, workspace, other_workspace):
    """The HTML pages render their forms (number boxes for related rows, never a list of every row)."""
    client = api_as(owner)
    golden = make_set(workspace)
    version = new_version(workspace)
    run = make_run(golden, version, status=EvalRun.Status.COMPLETED)
    add_results(run, 1)
    promotion = Promotion.objects.create(workflow=version.workflow, workflow_version=version, action="promote")
    make_set(other_workspace, name="Globex secret set")
    pages = [SETS, f"{SETS}{golden.pk}/", f"{SETS}{golden.pk}/import/", f"{SETS}{golden.pk}/compare/?a=1&b=2",
             ITEMS_URL, f"{ITEMS_URL}{golden.items.get().pk}/", RUNS, f"{RUNS}{run.pk}/", f"{RUNS}{run.pk}/results/",
             f"{RUNS}{run.pk}/cancel/", f"{RUNS}{run.pk}/rewrite/", PROMOTIONS, f"{PROMOTIONS}{promotion.pk}/",
             f"{VERSIONS}{version.pk}/promote/", f"{WORKFLOWS}{version.workflow_id}/rollback/"]
    for url in pages:
        response = client.get(url, {"format": "api"}, HTTP_ACCEPT="text/html")
        assert response.status_code in (200, 400, 405), (url, response.status_code)
        assert "Globex" not in response.content.decode(), url
