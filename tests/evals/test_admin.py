"""The evals admin: what an operator sees of golden sets (items, graders, import, run eval), eval runs
(aggregates, histogram, results, cancel, propose rewrite), the compare page (paired scores, chart,
statistics, promote and rollback) and the read-only results and promotions, and the guarantees around
them: workspace scope, POST views with CSRF and the change permission, escaped user text (also in the
SVG), query budgets that do not grow with rows."""

import json
import re
from decimal import Decimal

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from durable.inprocess import run_until_settled
from durable.models import DurableRun
from evals import charts
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet, Promotion
from evals.selectors import score_histogram
from evals.services import eval_run_cancel, eval_run_start, golden_item_add, golden_set_create, version_promote
from tests.admin_users import admin_staff, client_of
from tests.builders import graph, node
from tests.evals.conftest import result_key
from tests.factories import MembershipFactory
from workflows.models import WorkflowVersion
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script>'
XSS_IMG = '<img src=x onerror=alert("i")>'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Runs are driven in-process here (run_until_settled)."""
    settings.DURABLE_DISPATCH_ENABLED = False


def staff_user(username: str, workspace, *, codenames=None):
    """A staff member of `workspace` with the evals and workflows apps' permissions (`codenames` to narrow
    them)."""
    return admin_staff(username, workspace, apps=("evals", "workflows"), codenames=codenames)


@pytest.fixture
def staff(workspace):
    return staff_user("acme-staff", workspace)


@pytest.fixture
def staff_client(staff):
    return client_of(staff)


@pytest.fixture
def outsider_client(other_workspace):
    return client_of(staff_user("globex-staff", other_workspace))


@pytest.fixture
def viewer_client(workspace):
    """A member who may only look."""
    client = Client()
    client.force_login(staff_user("viewer", workspace, codenames=[
        "view_goldenset", "view_evalrun", "view_goldenresult", "view_promotion", "view_workflowversion"]))
    return client


@pytest.fixture
def linked_set(support_set, support_versions):
    """The support set evaluating the support workflow."""
    support_set.workflow = support_versions[0].workflow
    support_set.save(update_fields=["workflow", "updated_at"])
    return support_set


@pytest.fixture
def evaluated(facts, linked_set, support_versions, evaluate):
    """The base version active, both versions evaluated on the set (the better one searches first)."""
    base, better = support_versions
    workflow_version_activate(version=base)
    base_run, better_run = evaluate(linked_set, base), evaluate(linked_set, better)
    assert base_run.status == better_run.status == "completed"
    base.refresh_from_db()
    better.refresh_from_db()
    return {"set": linked_set, "base": base, "better": better, "base_run": base_run, "better_run": better_run}


def change_url(model: str, pk) -> str:
    return reverse(f"admin:evals_{model}_change", args=[pk])


def set_url(golden_set, view: str) -> str:
    return reverse(f"admin:evals_goldenset_{view}", args=[golden_set.pk])


def compare_url(golden_set, a, b) -> str:
    return set_url(golden_set, "compare") + f"?a={a.pk}&b={b.pk}"


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured)


# ----------------------------------------------------------------------------------------- the lists

def test_every_evals_changelist_opens(staff_client, evaluated):
    for model in ("goldenset", "goldenitem", "evalrun", "goldenresult", "promotion"):
        response = staff_client.get(reverse(f"admin:evals_{model}_changelist"))
        assert response.status_code == 200, model


def test_golden_set_list_shows_workspace_workflow_items_threshold_graders_and_last_score(staff_client, evaluated):
    golden_set_create(workspace=evaluated["set"].workspace, name="empty", graders=[{"kind": "exact"}])
    response = staff_client.get(reverse("admin:evals_goldenset_changelist"))
    html = response.content.decode()
    rows = {row.name: row for row in response.context["cl"].result_list}
    assert set(rows) == {"support", "empty"}
    assert rows["support"].items_n == 6 and rows["empty"].items_n == 0
    assert rows["support"].last_run_id == evaluated["base_run"].pk  # the active version's latest completed run
    assert "contains (weight 2) + token_f1" in html and ">exact<" in html
    assert "Acme" in html and "support" in html and "0.7" in html
    assert f'{change_url("evalrun", evaluated["base_run"].pk)}">{evaluated["base_run"].avg_score:.3f}</a>' in html


def test_eval_run_list_shows_set_version_status_scores_cost_and_progress(staff_client, evaluated, support_versions):
    queued = eval_run_start(golden_set=evaluated["set"], version=support_versions[0])
    url = reverse("admin:evals_evalrun_changelist")
    response = staff_client.get(url)
    html = response.content.decode()
    assert [row.pk for row in response.context["cl"].result_list] == [
        queued.pk, evaluated["better_run"].pk, evaluated["base_run"].pk]
    run = evaluated["better_run"]
    assert f"{run.avg_score:.3f}" in html and f"{run.pass_rate * 100:.0f}%" in html and f"{run.fitness:.1f}" in html
    assert "6 / 6" in html and "0 / 0" in html and "$0.00" in html
    assert evaluated["better"].dsl_hash[:12] in html and 'class="wf-status wf-status-queued"' in html

    def listed(query):
        return {row.pk for row in staff_client.get(url + query).context["cl"].result_list}

    assert listed("?status__exact=queued") == {queued.pk}
    assert listed(f"?golden_set={evaluated['set'].pk}") == {queued.pk, run.pk, evaluated["base_run"].pk}
    assert listed(f"?q={run.pk}") == {run.pk}
    assert listed(f"?q={evaluated['better'].dsl_hash[:10]}") == {run.pk}
    facets = staff_client.get(url + "?_facets=True").content.decode()
    assert re.search(r"Completed\s*\(2\)", facets) and re.search(r"Queued\s*\(1\)", facets)


# ---------------------------------------------------------------------------------- golden set page

def item_rows(golden_set, items, *, extra=()):
    """The inline formset's POST data: the existing `items` ({field: value} changes applied through
    (item, changes) pairs) and `extra` new items."""
    data = {"items-TOTAL_FORMS": str(len(items) + len(extra)), "items-INITIAL_FORMS": str(len(items)),
            "items-MIN_NUM_FORMS": "0", "items-MAX_NUM_FORMS": "1000"}
    for index, (item, changes) in enumerate([*items, *((None, new) for new in extra)]):
        values = {"position": item.position if item else "",
                  "input": json.dumps(item.input) if item else "",
                  "expected_output": item.expected_output if item else "",
                  "scoring_criteria": item.scoring_criteria if item else "",
                  "rubric": json.dumps(item.rubric) if item else "[]",
                  "tags": json.dumps(item.tags) if item else "[]",
                  "metadata": json.dumps(item.metadata) if item else "{}",
                  "split": item.split if item else "",
                  "id": item.pk if item else "", "golden_set": golden_set.pk}
        values.update(changes)
        data.update({f"items-{index}-{key}": value for key, value in values.items()})
    return data


def set_form(golden_set, items=(), *, extra=(), **fields):
    data = {"name": golden_set.name, "workflow": golden_set.workflow_id or "", "description": golden_set.description,
            "pass_threshold": golden_set.pass_threshold, "graders": json.dumps(golden_set.graders)}
    data.update(fields)
    data.update(item_rows(golden_set, list(items), extra=extra))
    return data


def test_golden_set_page_lists_items_in_order_and_offers_run_import_and_compare(staff_client, evaluated):
    golden_set, base = evaluated["set"], evaluated["base"]
    last = golden_set.items.order_by("position").last()
    GoldenItem.objects.filter(pk=last.pk).update(position=0)  # moved first
    response = staff_client.get(change_url("goldenset", golden_set.pk))
    assert response.status_code == 200
    html = response.content.decode()
    forms = response.context["inline_admin_formsets"][0].formset.forms
    assert forms[0].instance.pk == last.pk and len(forms) == 7  # six items and a blank one
    assert "How long do refunds take?" in html and "&quot;critical&quot;" in html
    assert set_url(golden_set, "import") in html and set_url(golden_set, "compare") in html
    # the run form offers the workflow's versions, the active one chosen
    choices = dict(response.context["run_form"].fields["version"].choices)
    assert set(choices) == {base.pk, evaluated["better"].pk}
    assert re.search(rf'<option value="{base.pk}" selected>{base.dsl_hash[:12]} · Active', html)
    assert 'id="ev-run"' in html
    runs = response.context["recent_runs"]
    assert [run["pk"] for run in runs] == [evaluated["better_run"].pk, evaluated["base_run"].pk]


def test_items_are_edited_inline_and_a_new_item_without_a_position_goes_last(staff_client, linked_set):
    items = list(linked_set.items.order_by("position"))
    first = items[0]
    response = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
        linked_set, [(first, {"expected_output": "Five business days.", "tags": '["critical", "refunds"]'}),
                     *((item, {}) for item in items[1:])],
        extra=[{"input": '{"text": "Do you ship abroad?"}', "expected_output": "No.",
                "rubric": '[{"criterion": "says no", "max_points": 1}]'}]))
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    first.refresh_from_db()
    assert first.expected_output == "Five business days." and first.tags == ["critical", "refunds"]
    added = linked_set.items.order_by("position").last()
    assert added.input == {"text": "Do you ship abroad?"} and added.position == items[-1].position + 1
    assert added.rubric == [{"criterion": "says no", "max_points": 1}] and added.metadata == {}


def test_an_items_split_is_edited_inline_and_a_new_item_is_dealt_one(staff_client, linked_set):
    items = list(linked_set.items.order_by("position"))
    assert {item.split for item in items} <= {"train", "validation", "test"}
    first = items[0]
    moved_to = "test" if first.split != "test" else "validation"
    others = {item.pk: item.split for item in items[1:]}
    response = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
        linked_set, [(first, {"split": moved_to}), *((item, {}) for item in items[1:])],
        extra=[{"input": '"dealt"', "tags": '["refunds"]'}, {"input": '"chosen"', "split": "validation"}]))
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    first.refresh_from_db()
    assert first.split == moved_to
    assert dict(linked_set.items.filter(pk__in=others).values_list("pk", "split")) == others
    dealt, chosen = linked_set.items.order_by("position")[6:]
    assert dealt.split in ("train", "validation", "test") and chosen.split == "validation"

    # an item keeps a split: emptying it is an error on that row, and nothing is saved
    response = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
        linked_set, [(first, {"split": ""}), *((item, {}) for item in linked_set.items.order_by("position")[1:])]))
    assert response.status_code == 200
    assert "split" in response.context["inline_admin_formsets"][0].formset.forms[0].errors
    first.refresh_from_db()
    assert first.split == moved_to


def test_the_set_page_and_list_show_the_splits_or_why_no_held_out_claim_is_possible(staff_client, linked_set):
    page = staff_client.get(change_url("goldenset", linked_set.pk))
    html = page.content.decode()
    assert 'id="ev-splits"' in html and 'data-held-out="false"' in html
    assert "The set has 6 items: a held-out split needs at least 12 (EVAL_MIN_SPLIT_ITEMS)" in html
    for index in range(8):
        golden_item_add(golden_set=linked_set, input={"text": f"more {index}"}, tags=["shipping"])
    page = staff_client.get(change_url("goldenset", linked_set.pk))
    html = page.content.decode()
    assert 'data-held-out="true"' in html and "14 items: train, validation and test can carry a held-out claim" in html
    plan = page.context["split_plan"]
    assert sum(plan.counts.values()) == 14 and min(plan.counts.values()) >= 3
    assert plan.strata["shipping"] == {"train": 4, "validation": 2, "test": 2}
    assert re.search(r'<tr class="ev-stratum"><td>shipping</td><td>4</td><td>2</td><td>2</td></tr>', html)
    assert "50% / 25% / 25%" in html
    listing = staff_client.get(reverse("admin:evals_goldenset_changelist")).content.decode()
    counts = " / ".join(str(plan.counts[split]) for split in ("train", "validation", "test"))
    assert f'<td class="field-splits_display">{counts}</td>' in listing


def test_the_item_list_shows_each_items_split_and_filters_on_it(staff_client, linked_set, other_workspace):
    theirs = golden_set_create(workspace=other_workspace, name="theirs", graders=[{"kind": "exact"}])
    golden_item_add(golden_set=theirs, input="their question", split="test")
    url = reverse("admin:evals_goldenitem_changelist")
    listed = staff_client.get(url).context["cl"].result_list
    assert {item.pk for item in listed} == set(linked_set.items.values_list("pk", flat=True))
    tests = set(linked_set.items.filter(split="test").values_list("pk", flat=True))
    assert tests and {item.pk for item in staff_client.get(url + "?split__exact=test").context["cl"].result_list} \
        == tests
    html = staff_client.get(url + f"?golden_set={linked_set.pk}").content.decode()
    assert '<td class="field-split">Test</td>' in html and "their question" not in html
    item = linked_set.items.filter(split="test").first()
    page = staff_client.get(change_url("goldenitem", item.pk))
    assert page.status_code == 200 and "Test" in page.content.decode()
    assert staff_client.post(change_url("goldenitem", item.pk), {"split": "train"}).status_code == 403


def test_item_fields_are_checked_like_the_service_checks_them(staff_client, linked_set):
    items = list(linked_set.items.order_by("position"))
    before = list(linked_set.items.values_list("content_hash", flat=True))
    response = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
        linked_set, [(items[0], {"rubric": '[{"criterion": "x"}]'}), (items[1], {"tags": '"critical"'}),
                     (items[2], {"input": "{}"}), (items[3], {"input": "not json"}),
                     (items[4], {"metadata": "[1]"}), (items[5], {"input": '{"text": "NaN", "n": NaN}'})]))
    assert response.status_code == 200
    errors = [form.errors for form in response.context["inline_admin_formsets"][0].formset.forms]
    assert "must be a list of" in str(errors[0]["rubric"])
    assert "must be a list of short names" in str(errors[1]["tags"])
    assert "is required" in str(errors[2]["input"])
    assert "Enter a valid JSON" in str(errors[3]["input"])
    assert "must be an object" in str(errors[4]["metadata"])
    assert "finite" in str(errors[5]["input"])
    assert list(linked_set.items.values_list("content_hash", flat=True)) == before


def test_grader_errors_name_the_entry_and_the_option(staff_client, linked_set):
    items = [(item, {}) for item in linked_set.items.order_by("position")]
    graders = [{"kind": "contains"}, {"kind": "regex", "pattern": "(?:ab|cd){1000000}"},
               {"kind": "exact", "colour": "red"}, {"kind": "nonsense"}]
    response = staff_client.post(change_url("goldenset", linked_set.pk),
                                 set_form(linked_set, items, graders=json.dumps(graders)))
    assert response.status_code == 200
    problems = response.context["adminform"].form.errors["graders"]
    assert any(problem.startswith("graders[1].pattern: ") for problem in problems)
    assert any(problem.startswith("graders[2].colour: unknown option for the exact grader") for problem in problems)
    assert any(problem.startswith("graders[3].kind: unknown grader kind 'nonsense'") for problem in problems)
    assert "graders[1].pattern" in response.content.decode()
    linked_set.refresh_from_db()
    assert linked_set.graders[0]["kind"] == "contains" and len(linked_set.graders) == 2
    # a good configuration is stored normalized (weights as floats, defaults filled in)
    ok = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
        linked_set, items, graders='[{"kind": "regex", "pattern": "five", "weight": 2}]', pass_threshold="0.5"))
    assert ok.status_code == 302
    linked_set.refresh_from_db()
    assert linked_set.graders == [{"kind": "regex", "pattern": "five", "weight": 2.0, "flags": ""}]
    assert linked_set.pass_threshold == 0.5


def test_items_with_results_are_not_deleted(staff_client, evaluated):
    golden_set = evaluated["set"]
    items = [(item, {"DELETE": "on"} if index == 0 else {}) for index, item in
             enumerate(golden_set.items.order_by("position"))]
    response = staff_client.post(change_url("goldenset", golden_set.pk), set_form(golden_set, items))
    assert response.status_code == 200
    assert "results of eval runs, which are append-only" in response.content.decode()
    assert golden_set.items.count() == 6
    fresh = golden_item_add(golden_set=golden_set, input={"text": "unused"})
    items = [(item, {"DELETE": "on"} if item.pk == fresh.pk else {}) for item in golden_set.items.order_by("position")]
    assert staff_client.post(change_url("goldenset", golden_set.pk), set_form(golden_set, items)).status_code == 302
    assert not GoldenItem.objects.filter(pk=fresh.pk).exists()


def test_items_are_neither_changed_nor_deleted_under_a_running_eval_run(staff_client, linked_set, support_versions):
    run = eval_run_start(golden_set=linked_set, version=support_versions[0])  # queued: no worker drives it here
    items = list(linked_set.items.order_by("position"))
    before = sorted(linked_set.items.values_list("pk", "content_hash"))
    for change in ({"expected_output": "Changed under the run."}, {"DELETE": "on"}):
        response = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
            linked_set, [(items[-1], change), *((item, {}) for item in items[:-1])], description="edited too"))
        assert response.status_code == 200, change
        assert f"An eval run of golden set {linked_set.pk} is in progress" in response.content.decode()
        assert sorted(linked_set.items.values_list("pk", "content_hash")) == before
        linked_set.refresh_from_db()
        assert linked_set.description != "edited too"
    eval_run_cancel(eval_run=run)
    response = staff_client.post(change_url("goldenset", linked_set.pk), set_form(
        linked_set, [(items[-1], {"expected_output": "Changed after the run."}), *((item, {}) for item in items[:-1])]))
    assert response.status_code == 302
    assert linked_set.items.get(pk=items[-1].pk).expected_output == "Changed after the run."


def test_a_set_is_added_with_its_creator_and_a_workflow_of_its_workspace(client, workspace, other_workspace):
    user = staff_user("both", workspace)
    MembershipFactory(user=user, workspace=other_workspace)
    client.force_login(user)
    theirs = workflow_create(workspace=other_workspace, name="globex flow")
    ours = workflow_create(workspace=workspace, name="acme flow")
    data = {"workspace": workspace.pk, "name": "new set", "workflow": theirs.pk, "description": "",
            "pass_threshold": "0.8", "graders": '[{"kind": "token_f1"}]', **item_rows(None, [])}
    refused = client.post(reverse("admin:evals_goldenset_add"), data)
    assert refused.status_code == 200
    assert "belongs to another workspace" in str(refused.context["adminform"].form.errors["workflow"])
    created = client.post(reverse("admin:evals_goldenset_add"), {**data, "workflow": ours.pk})
    assert created.status_code == 302
    golden_set = GoldenSet.objects.get(name="new set")
    assert golden_set.created_by == user and golden_set.workflow == ours
    assert golden_set.graders == [{"kind": "token_f1", "weight": 1.0}]
    # the workspace of a saved set is read-only
    page = client.get(change_url("goldenset", golden_set.pk))
    assert "workspace" not in page.context["adminform"].form.fields


def test_titles_and_breadcrumbs_name_things_and_scores_read_to_three_places(staff_client, evaluated):
    run, base = evaluated["base_run"], evaluated["base"]
    result = GoldenResult.objects.filter(eval_run=run).select_related("golden_item").order_by("pk").first()
    GoldenResult.objects.filter(pk=result.pk).update(score=0.052083)
    page = staff_client.get(change_url("goldenresult", result.pk)).content.decode()
    title = re.search(r"<h2>(.*?)</h2>", page)[1]
    assert "0.052083" not in page and title == f"{result.golden_item.input['text']} · score 0.052"
    page = staff_client.get(change_url("evalrun", run.pk)).content.decode()
    crumbs = re.search(r'<div class="breadcrumbs">(.*?)</div>', page, re.S)[1]
    assert base.dsl_hash[:12] in crumbs and evaluated["set"].name in crumbs
    assert f"of {base.pk} on" not in crumbs and f"of {base.pk} on" not in page


# ---------------------------------------------------------------------------------------------- import

def upload(client, golden_set, name: str, content: str | bytes, kind: str = "auto"):
    data = content.encode() if isinstance(content, str) else content
    return client.post(set_url(golden_set, "import"), {"file": SimpleUploadedFile(name, data), "format": kind})


def test_import_of_json_lines_appends_the_items_in_order(staff_client, linked_set):
    page = staff_client.get(set_url(linked_set, "import"))
    assert page.status_code == 200 and 'enctype="multipart/form-data"' in page.content.decode()
    last = linked_set.items.order_by("position").last().position
    lines = [
        json.dumps({"input": {"text": "Do you ship abroad?"}, "expected_output": "No.", "tags": ["critical"]}),
        "",
        json.dumps({"input": "Plain text input", "expected_output": {"severity": "P1"},
                    "rubric": [{"criterion": "names the severity", "max_points": 2}], "metadata": {"source": "t"}}),
    ]
    response = upload(staff_client, linked_set, "more.jsonl", "\n".join(lines) + "\n")
    assert response.status_code == 302 and response.url == change_url("goldenset", linked_set.pk)
    assert any(f"Imported 2 item(s) into support (positions {last + 1} to {last + 2})" in text
               for text in messages_of(response))
    first, second = linked_set.items.order_by("position")[6:]
    assert (first.input, first.tags, first.position) == ({"text": "Do you ship abroad?"}, ["critical"], last + 1)
    assert second.input == "Plain text input" and json.loads(second.expected_output) == {"severity": "P1"}
    assert second.rubric == [{"criterion": "names the severity", "max_points": 2}]


def test_import_of_csv_reads_text_json_and_comma_separated_tags(staff_client, linked_set):
    content = ('input,expected_output,tags,metadata\n'
               'How late is support open?,Until five.,"critical, hours",\n'
               '"{""text"": ""Is there a warranty?""}","Yes, two years.",["warranty"],"{""origin"": ""csv""}"\n')
    response = upload(staff_client, linked_set, "items.csv", "\ufeff" + content)  # with a byte-order mark
    assert response.status_code == 302
    first, second = linked_set.items.order_by("position")[6:]
    assert first.input == "How late is support open?" and first.tags == ["critical", "hours"]
    assert second.input == {"text": "Is there a warranty?"} and second.expected_output == "Yes, two years."
    assert second.tags == ["warranty"] and second.metadata == {"origin": "csv"}


def test_an_import_with_bad_lines_adds_nothing_and_names_each_line(staff_client, linked_set):
    lines = [
        json.dumps({"input": "fine"}),
        '{"input": "broken",',
        json.dumps({"expected_output": "no input"}),
        json.dumps({"input": "q", "rubric": [{"criterion": "x"}]}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"input": "q", "colour": "red"}),
        json.dumps({"input": "q", "tags": "critical"}),
        '{"input": "q", "metadata": {"n": NaN}}',
        json.dumps({"input": "nul \u0000 here"}),
    ]
    response = upload(staff_client, linked_set, "bad.jsonl", "\n".join(lines))
    assert response.status_code == 200
    errors = response.context["errors"]
    assert errors[0].startswith("line 2: line: is not valid JSON")
    assert errors[1:] == [
        "line 3: input: is required",
        'line 4: rubric: must be a list of {"criterion": text, "max_points": a number from 0 to 1000}',
        "line 5: line: must be a JSON object with an `input` key",
        "line 6: colour: unknown key; known: input, expected_output, scoring_criteria, rubric, tags, metadata, "
        "split",
        # line 7's tags are comma-separated names, which the API's rules accept (evals/importing.py)
        "line 8: line: is not valid JSON: NaN is not a JSON number",
        "line 9: input: Null characters are not allowed.",
    ]
    html = response.content.decode()
    assert "Nothing was imported: 7 problems in the file" in html and "line 6: colour: unknown key" in html
    assert linked_set.items.count() == 6

    csv_errors = upload(staff_client, linked_set, "bad.csv", 'input,rubric,colour\nq,[,x\n').context["errors"]
    assert csv_errors == ["Unknown CSV column(s) 'colour'; the header names columns among input, expected_output, "
                          "scoring_criteria, rubric, tags, metadata, split."]
    csv_errors = upload(staff_client, linked_set, "bad.csv", 'input,rubric\nq,[\n"",\nok,\n').context["errors"]
    assert csv_errors[0].startswith("line 2: rubric: is not valid JSON")
    assert len(csv_errors) == 1  # line 3 (`"",`) is a blank row, skipped as the API skips it
    assert upload(staff_client, linked_set, "empty.jsonl", "\n\n").context["errors"] == ["The file has no items."]
    assert upload(staff_client, linked_set, "latin.csv", "input\ncaf\xe9\n".encode("latin-1")).context["errors"] == [
        "The file is not UTF-8 text: byte 0xe9 on line 2 cannot be read; save it as UTF-8."]
    assert linked_set.items.count() == 6


# ---------------------------------------------------------------------------------------------- run eval

def test_run_eval_starts_a_run_of_the_chosen_version_that_completes(staff_client, staff, facts, linked_set,
                                                                      support_versions):
    _, better = support_versions
    response = staff_client.post(set_url(linked_set, "run"), {"version": better.pk, "reuse": "on"})
    run = EvalRun.objects.get()
    assert response.status_code == 302 and response.url == change_url("evalrun", run.pk)
    assert any(f"Started eval run {run.pk} of {better.dsl_hash[:12]} on support" in text
               for text in messages_of(response))
    assert (run.workflow_version, run.created_by, run.reuse, run.status) == (better, staff, True, "queued")
    run_until_settled(run.durable_run_id, max_wait=60)
    page = staff_client.get(change_url("evalrun", run.pk)).content.decode()
    assert 'class="wf-status wf-status-completed"' in page and "6 / 6" in page
    again = staff_client.post(set_url(linked_set, "run"), {"version": better.pk})  # reuse unticked
    assert EvalRun.objects.get(pk=again.url.rstrip("/").split("/")[-2]).reuse is False


def test_a_refused_eval_run_shows_why(staff_client, workspace, linked_set, support_versions, make_version):
    base, _ = support_versions
    empty = golden_set_create(workspace=workspace, name="empty", workflow=base.workflow, graders=[{"kind": "exact"}])
    response = staff_client.post(set_url(empty, "run"), {"version": base.pk})
    assert response.status_code == 302 and response.url == change_url("goldenset", empty.pk)
    assert any("Not started: golden_set: has no items" in text for text in messages_of(response))
    elsewhere = make_version(graph("a", node("a")), name="another workflow")
    response = staff_client.post(set_url(linked_set, "run"), {"version": elsewhere.pk})
    assert any("Not started: version: Select a valid choice" in text for text in messages_of(response))
    broken = make_version(graph("a", node("a", tools=["no_such_tool"])), name="broken")
    linked_set.workflow = broken.workflow
    linked_set.save()
    response = staff_client.post(set_url(linked_set, "run"), {"version": broken.pk})
    assert any("Not started: tools: a.no_such_tool is not available" in text for text in messages_of(response))
    unlinked = golden_set_create(workspace=workspace, name="unlinked", graders=[{"kind": "exact"}])
    response = staff_client.post(set_url(unlinked, "run"), {"version": base.pk})
    assert any("the set has no workflow" in text for text in messages_of(response))
    assert "Choose the workflow this set evaluates" in staff_client.get(
        change_url("goldenset", unlinked.pk)).content.decode()
    assert not EvalRun.objects.exists()


def test_the_run_action_runs_the_active_version_of_each_selected_set(staff_client, workspace, linked_set,
                                                                      support_versions):
    base, _ = support_versions
    unlinked = golden_set_create(workspace=workspace, name="unlinked", graders=[{"kind": "exact"}])
    response = staff_client.post(reverse("admin:evals_goldenset_changelist"), {
        "action": "run_active_versions", "_selected_action": [linked_set.pk, unlinked.pk]})
    assert any("Started 0 eval run(s) for 2 selected set(s)" in text for text in messages_of(response))
    workflow_version_activate(version=base)
    response = staff_client.post(reverse("admin:evals_goldenset_changelist"), {
        "action": "run_active_versions", "_selected_action": [linked_set.pk, unlinked.pk]})
    assert any("Started 1 eval run(s) for 2 selected set(s)" in text for text in messages_of(response))
    assert list(EvalRun.objects.values_list("golden_set", "workflow_version")) == [(linked_set.pk, base.pk)]


# ------------------------------------------------------------------------------------------ eval run page

def test_eval_run_page_shows_config_aggregates_histogram_results_and_links(staff_client, evaluated):
    run = evaluated["base_run"]
    response = staff_client.get(change_url("evalrun", run.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert f"Eval run {run.pk} of support @ {evaluated['base'].dsl_hash[:12]} on support" in html
    assert f"{run.avg_score:.3f}" in html and f"{run.pass_rate * 100:.0f}%" in html and f"{run.fitness:.1f}" in html
    assert "&quot;threshold&quot;: 0.7" in html and "&quot;kind&quot;: &quot;contains&quot;" in html  # the config
    assert reverse("admin:durable_durablerun_change", args=[run.durable_run_id]) in html
    assert "p50 " in html and "for the version&#x27;s invocations" in html
    # the histogram: ten bins over 0..1 with axis labels, counting every scored item
    svg = str(response.context["histogram_svg"])
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="ev-histogram"') and svg in html
    bars = re.findall(r'class="ev-hist-bar" data-low="([\d.]+)" data-high="([\d.]+)" data-count="(\d+)"', svg)
    assert len(bars) == 10 and bars[0][:2] == ("0", "0.1") and bars[-1][:2] == ("0.9", "1")
    assert sum(int(count) for *_, count in bars) == 6
    assert [int(count) for *_, count in bars] == [b["count"] for b in score_histogram(run)]
    assert ">score</text>" in svg and ">items</text>" in svg and ">0.5</text>" in svg
    # one row per item, in position order, each linking its invocation
    results = response.context["results"]
    items = list(evaluated["set"].items.order_by("position"))
    assert [row["item"] for row in results] == [item.pk for item in items]
    stored = {r.golden_item_id: r for r in GoldenResult.objects.filter(eval_run=run)}
    for row in results:
        result = stored[row["item"]]
        assert row["score"] == f"{result.score:.3f}" and row["passed"] == result.passed
        assert reverse("admin:workflows_workflowinvocation_change", args=[result.workflow_invocation_id]) in html
        assert row["grader"] == result.grader and not row["reused"]
    assert "How long do refunds take?" in html and "Refunds take five business days." in html
    assert 'class="ev-reused"' not in html
    # a completed run offers a rewrite, not a cancel
    assert 'id="ev-propose"' in html and 'id="ev-cancel"' not in html


def test_a_reused_result_is_badged_and_a_long_answer_starts_collapsed(staff_client, evaluated, evaluate):
    again = evaluate(evaluated["set"], evaluated["base"])
    assert again.items_reused == 6
    html = staff_client.get(change_url("evalrun", again.pk)).content.decode()
    assert html.count('<span class="ev-reused"') == 6
    assert "6 / 6 (6 reused)" in html
    first = GoldenResult.objects.filter(eval_run=again).order_by("golden_item__position").first()
    long_run = EvalRun.objects.create(workspace=again.workspace, golden_set=again.golden_set,
                                      workflow_version=again.workflow_version, status="completed")
    GoldenResult.objects.create(eval_run=long_run, golden_item=first.golden_item,
                                workflow_version=first.workflow_version, actual_output="word " * 200, score=0.5,
                                grader="token_f1", reuse_key="k")
    html = staff_client.get(change_url("evalrun", long_run.pk)).content.decode()
    assert re.search(r'<td class="ev-text ev-actual"><details class="wf-more"><summary>word word', html)


def test_cancel_ends_an_active_eval_run_and_its_durable_run(staff_client, linked_set, support_versions):
    run = eval_run_start(golden_set=linked_set, version=support_versions[0])
    page = staff_client.get(change_url("evalrun", run.pk)).content.decode()
    assert 'id="ev-cancel"' in page and 'id="ev-propose"' not in page
    url = reverse("admin:evals_evalrun_cancel", args=[run.pk])
    response = staff_client.post(url)
    assert response.status_code == 302 and response.url == change_url("evalrun", run.pk)
    assert any(f"Cancelled eval run {run.pk}." in text for text in messages_of(response))
    run.refresh_from_db()
    assert run.status == "cancelled" and DurableRun.objects.get(pk=run.durable_run_id).status == "cancelled"
    again = staff_client.post(url)
    assert any("was not cancelled: it is cancelled" in text for text in messages_of(again))
    assert 'id="ev-cancel"' not in staff_client.get(change_url("evalrun", run.pk)).content.decode()


def test_the_cancel_action_cancels_only_active_runs(staff_client, evaluated):
    active = eval_run_start(golden_set=evaluated["set"], version=evaluated["better"])
    response = staff_client.post(reverse("admin:evals_evalrun_changelist"), {
        "action": "cancel_eval_runs", "_selected_action": [active.pk, evaluated["base_run"].pk]})
    assert any("Cancelled 1 of 2 selected eval runs" in text for text in messages_of(response))
    assert EvalRun.objects.get(pk=active.pk).status == "cancelled"
    assert EvalRun.objects.get(pk=evaluated["base_run"].pk).status == "completed"


def test_propose_rewrite_writes_a_candidate_and_links_it(staff_client, staff, evaluated, evaluate):
    base = evaluated["base"]
    # the offline rewriter adds the search the base version lacks: exactly the better version (content-addressed)
    response = staff_client.post(reverse("admin:evals_evalrun_propose", args=[evaluated["base_run"].pk]))
    assert response.status_code == 302 and response.url == change_url("evalrun", evaluated["base_run"].pk)
    [text] = messages_of(response)
    assert text.startswith("The rewrite is the existing version <a href=")
    assert evaluated["better"].dsl_hash[:12] in text and "rewrite of node agent by offline-rules" in text

    terse, _ = workflow_version_create(workflow=base.workflow, dsl=graph("agent", node(
        "agent", prompt="You answer questions about our shop.")), parents=(base,), operation="mutation")
    run = evaluate(evaluated["set"], terse)
    versions = set(WorkflowVersion.objects.values_list("pk", flat=True))
    text = messages_of(staff_client.post(reverse("admin:evals_evalrun_propose", args=[run.pk])))[-1]
    proposed = WorkflowVersion.objects.exclude(pk__in=versions).get()
    assert text.startswith("Proposed the candidate version <a href=")
    assert reverse("admin:workflows_workflowversion_change", args=[proposed.pk]) in text
    assert proposed.dsl_hash[:12] in text and "knowledge_search" in text  # the changelog
    assert f"?a={terse.pk}&amp;b={proposed.pk}" in text  # the comparison to make next
    assert (proposed.parent1_id, proposed.status, proposed.created_by) == (terse.pk, "candidate", staff)
    # a run that is not complete has nothing to learn from
    queued = eval_run_start(golden_set=evaluated["set"], version=base)
    refused = messages_of(staff_client.post(reverse("admin:evals_evalrun_propose", args=[queued.pk])))
    assert "No rewrite proposed: eval run" in refused[-1] and "is queued" in refused[-1]
    assert WorkflowVersion.objects.count() == len(versions) + 1


def test_propose_rewrite_says_why_nothing_was_proposed(staff_client, evaluated):
    perfect = EvalRun.objects.create(workspace=evaluated["set"].workspace, golden_set=evaluated["set"],
                                     workflow_version=evaluated["better"], status="completed")
    text = messages_of(staff_client.post(reverse("admin:evals_evalrun_propose", args=[perfect.pk])))[0]
    assert text == "No rewrite proposed: no failing item to learn from."


# ------------------------------------------------------------------------------------- compare, promote

def completed_run(golden_set, version, score_of) -> EvalRun:
    """A completed eval run with a result per item scored `score_of(item)` (written directly: the
    numbers, not the grading, are what these tests are about)."""
    items = list(golden_set.items.order_by("position"))
    scores = [score_of(item) for item in items]
    run = EvalRun.objects.create(
        workspace=golden_set.workspace, golden_set=golden_set, workflow_version=version, status="completed",
        items_total=len(items), items_done=len(items), avg_score=sum(scores) / len(scores),
        pass_rate=sum(s >= golden_set.pass_threshold for s in scores) / len(scores), fitness=50.0,
        usd_cost=Decimal("0.001"), ended_at=timezone.now(), started_at=timezone.now(),
        config={"graders": golden_set.graders, "threshold": golden_set.pass_threshold})
    GoldenResult.objects.bulk_create([GoldenResult(
        eval_run=run, golden_item=item, workflow_version=version, actual_output=f"answer {index}", score=score,
        passed=score >= golden_set.pass_threshold, grader="contains+token_f1", grading_rationale="because",
        latency_ms=120.0, reuse_key=result_key(golden_set, version, item))
        for index, (item, score) in enumerate(zip(items, scores, strict=True))])
    return run


def test_compare_page_shows_items_side_by_side_the_chart_the_statistics_and_the_verdict(staff_client, evaluated):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    response = staff_client.get(compare_url(golden_set, base, better))
    assert response.status_code == 200
    html = response.content.decode()
    evidence = response.context["evidence"]
    assert evidence["comparison"]["verdict"] == "better"
    assert '<span class="ev-verdict ev-verdict-better" id="ev-verdict">better</span>' in html
    # per item: both scores and the difference, in position order
    scores_a = dict(GoldenResult.objects.filter(eval_run=evaluated["base_run"]).values_list("golden_item", "score"))
    scores_b = dict(GoldenResult.objects.filter(eval_run=evaluated["better_run"]).values_list("golden_item", "score"))
    rows = response.context["rows"]
    assert [row["item"] for row in rows] == list(golden_set.items.order_by("position").values_list("pk", flat=True))
    for row in rows:
        a, b = scores_a[row["item"]], scores_b[row["item"]]
        assert (row["a"], row["b"], row["diff"]) == (f"{a:.3f}", f"{b:.3f}", f"{b - a:+.3f}")
        assert re.search(rf'<tr class="ev-item" data-item="{row["item"]}">.*?<td class="ev-score-a">{row["a"]}</td>\s*'
                         rf'<td class="ev-score-b">{row["b"]}</td>', html, re.S)
    assert html.count('class="ev-item') == 6 and "How long do refunds take?" in html
    # the statistics, as compare_versions computed them
    comparison = evidence["comparison"]
    assert f'<td id="ev-mean-diff">{comparison["mean_diff"]:+.3f}</td>' in html
    assert f"{comparison['ci_low']:+.3f} to {comparison['ci_high']:+.3f}" in html
    assert f"{comparison['p_value']:.4f}" in html and "alpha = 0.05" in html
    assert '<td id="ev-critical">none' in html
    # the chart: a line per distinct pair of scores, carrying all six items, and the means
    svg = str(response.context["chart_svg"])
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="ev-paired"') and svg in html
    assert sum(int(n) for n in re.findall(r'data-items="(\d+)"', svg)) == 6
    assert 'class="ev-pair-mean"' in svg and f"b · {better.dsl_hash[:12]}" in svg
    # links to both runs and versions; promote offered (b is a candidate), rollback not (nothing archived)
    assert change_url("evalrun", evaluated["base_run"].pk) in html
    assert change_url("evalrun", evaluated["better_run"].pk) in html
    assert 'id="ev-promote"' in html and "Needs b significantly better than a, the active version" in html
    assert 'id="ev-rollback"' not in html and "No earlier active version to roll back to." in html


def test_compare_page_defaults_to_the_active_version_and_checks_its_choices(staff_client, evaluated, workspace):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    response = staff_client.get(set_url(golden_set, "compare"))
    assert (response.context["version_a"], response.context["version_b"]) == (base, better)
    choices = dict(response.context["form"].fields["a"].choices)
    assert choices[base.pk].startswith(f"{base.dsl_hash[:12]} · Active · score ") and "(1 run)" in choices[base.pk]
    same = staff_client.get(compare_url(golden_set, base, base))
    assert "comparison" not in same.context and "Choose two different versions." in same.content.decode()
    unevaluated, _ = workflow_version_create(workflow=base.workflow, dsl=graph("agent", node("agent", prompt="new")))
    missing = staff_client.get(compare_url(golden_set, base, unevaluated))
    assert "comparison" not in missing.context and "Select a valid choice" in missing.content.decode()
    bad = staff_client.get(set_url(golden_set, "compare") + "?a=x&b=99999999999999")
    assert bad.status_code == 200 and "comparison" not in bad.context
    lonely = golden_set_create(workspace=workspace, name="lonely", workflow=base.workflow, graders=[{"kind": "exact"}])
    assert 'id="ev-compare-empty"' in staff_client.get(set_url(lonely, "compare")).content.decode()


def test_a_set_shows_its_active_versions_score_and_compares_it_with_the_best_candidate(staff_client, evaluated):
    """A newer candidate (evolution's latest, scoring 0) is neither the set's score nor the default comparison."""
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    newest, _ = workflow_version_create(workflow=base.workflow, dsl=graph("agent", node("agent", prompt="newest")),
                                        parents=(better,), operation="mutation")
    EvalRun.objects.create(workspace=golden_set.workspace, golden_set=golden_set, workflow_version=newest,
                           status="completed", origin="evolution", items_total=6, items_done=6, avg_score=0.0,
                           pass_rate=0.0, started_at=timezone.now(), ended_at=timezone.now())
    response = staff_client.get(reverse("admin:evals_goldenset_changelist"))
    row = next(row for row in response.context["cl"].result_list if row.pk == golden_set.pk)
    assert row.last_run_id == evaluated["base_run"].pk
    assert f'{change_url("evalrun", evaluated["base_run"].pk)}">{evaluated["base_run"].avg_score:.3f}</a>' in \
        response.content.decode()
    compare = staff_client.get(set_url(golden_set, "compare"))
    assert (compare.context["version_a"], compare.context["version_b"]) == (base, better)


def test_promote_activates_b_and_records_the_evidence_then_rollback_restores_a(staff_client, staff, evaluated):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    form = {"version": better.pk, "a": base.pk, "b": better.pk}
    response = staff_client.post(set_url(golden_set, "promote"), form)
    assert response.status_code == 302 and response.url == compare_url(golden_set, base, better)
    text = messages_of(response)[-1]
    promotion = Promotion.objects.get()
    assert text.startswith(f"Promoted {better.dsl_hash[:12]} to the active version of support "
                           f"(it replaces version {base.dsl_hash[:12]}). Evidence: better on 6 paired items, "
                           "mean difference +")
    assert change_url("promotion", promotion.pk) in text
    better.refresh_from_db()
    base.refresh_from_db()
    assert (better.status, base.status) == ("active", "archived")
    assert (promotion.action, promotion.workflow_version, promotion.previous_version, promotion.decided_by,
            promotion.golden_set) == ("promote", better, base, staff, golden_set)
    assert promotion.evidence["comparison"]["verdict"] == "better"

    page = staff_client.get(response.url).content.decode()
    assert text.split(" (")[0] in page  # the message, shown on the page the POST went back to
    assert '<span id="ev-b-status">Active</span>' in page and 'id="ev-promote"' not in page
    assert "b is the active version: nothing to promote." in page
    assert f'Roll back to {base.dsl_hash[:12]}</button>' in page

    rolled = staff_client.post(set_url(golden_set, "rollback"), form)
    assert rolled.status_code == 302 and rolled.url == compare_url(golden_set, base, better)
    assert messages_of(rolled)[-1].startswith(f"Rolled back support: {base.dsl_hash[:12]} is the active version again "
                                              f"(it replaces {better.dsl_hash[:12]}).")
    base.refresh_from_db()
    assert base.status == "active" and Promotion.objects.filter(action="rollback", decided_by=staff).count() == 1


def test_a_refused_promotion_shows_the_refusal_and_its_evidence_and_changes_nothing(staff_client, evaluated):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    workflow_version_activate(version=better)
    page = staff_client.get(compare_url(golden_set, better, base)).content.decode()
    assert 'id="ev-verdict">worse<' in page and 'id="ev-promote"' in page  # base is archived: it may be tried
    response = staff_client.post(set_url(golden_set, "promote"), {"version": base.pk, "a": better.pk, "b": base.pk})
    assert response.status_code == 302 and response.url == compare_url(golden_set, better, base)
    text = messages_of(response)[-1]
    assert text.startswith("Not promoted: the candidate is not significantly better than the active version (worse, p=")
    assert "Evidence: worse on 6 paired items, mean difference -" in text and "95% interval" in text
    assert WorkflowVersion.objects.get(pk=better.pk).status == "active" and not Promotion.objects.exists()
    active = messages_of(staff_client.post(set_url(golden_set, "promote"), {"version": better.pk}))[-1]
    assert active == "Not promoted: workflow_version: is already the active version"


def test_rollback_without_an_earlier_active_version_is_refused(staff_client, evaluated):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    response = staff_client.post(set_url(golden_set, "rollback"), {"version": better.pk, "a": base.pk, "b": better.pk})
    assert messages_of(response)[-1] == "Not rolled back: workflow: has no earlier active version to roll back to"
    assert WorkflowVersion.objects.get(pk=base.pk).status == "active"


def test_a_critical_regression_is_highlighted_and_blocks_the_promotion(staff_client, linked_set, support_versions):
    base, better = support_versions
    workflow_version_activate(version=base)
    for number in range(3):
        golden_item_add(golden_set=linked_set, input={"text": f"extra {number}"}, expected_output="x")
    items = list(linked_set.items.order_by("position"))
    critical = next(item for item in items if item.critical)
    completed_run(linked_set, base, lambda item: 0.5)
    completed_run(linked_set, better, lambda item: 0.35 if item.pk == critical.pk else 0.8)
    response = staff_client.get(compare_url(linked_set, base, better))
    html = response.content.decode()
    assert response.context["comparison"]["verdict"] == "better"
    assert re.search(rf'<tr class="ev-item ev-regression" data-item="{critical.pk}">', html)
    assert html.count("ev-item ev-regression") == 1 and "critical regressions" in html
    assert f"#{critical.position} (0.500 → 0.350)" in html
    svg = str(response.context["chart_svg"])
    assert re.search(r'class="ev-pair ev-pair-down ev-pair-critical" data-items="1" data-a="0.50" data-b="0.35"', svg)
    text = messages_of(staff_client.post(set_url(linked_set, "promote"), {"version": better.pk}))[-1]
    assert text.startswith("Not promoted: 1 critical item(s) regressed. Evidence: better on 9 paired items")
    assert f"Critical items that regressed: item {critical.pk} (0.500 → 0.350)." in text
    assert WorkflowVersion.objects.get(pk=better.pk).status == "candidate"


def test_promote_names_only_versions_of_the_sets_workflow(staff_client, evaluated, make_version, other_workspace):
    elsewhere = make_version(graph("a", node("a")), name="other", workspace_=other_workspace)
    unrelated = make_version(graph("a", node("a")), name="unrelated")
    for version in (elsewhere, unrelated):
        text = messages_of(staff_client.post(set_url(evaluated["set"], "promote"), {"version": version.pk}))[-1]
        assert text == "Not promoted: choose a version of this set's workflow."
    assert WorkflowVersion.objects.get(pk=evaluated["base"].pk).status == "active"


# ---------------------------------------------------------------------------------- results, promotions

def test_results_and_promotions_are_read_only(staff_client, evaluated):
    promotion = version_promote(candidate=evaluated["better"], golden_set=evaluated["set"])
    result = GoldenResult.objects.filter(eval_run=evaluated["base_run"]).first()
    for model, pk in (("goldenresult", result.pk), ("promotion", promotion.pk), ("evalrun", evaluated["base_run"].pk)):
        page = staff_client.get(change_url(model, pk))
        assert page.status_code == 200, model
        assert staff_client.post(change_url(model, pk), {}).status_code == 403, model
        assert staff_client.get(reverse(f"admin:evals_{model}_add")).status_code == 403, model
        assert staff_client.post(reverse(f"admin:evals_{model}_delete", args=[pk]), {"post": "yes"}).status_code == 403
    assert GoldenResult.objects.filter(pk=result.pk).exists() and Promotion.objects.filter(pk=promotion.pk).exists()
    html = staff_client.get(change_url("promotion", promotion.pk)).content.decode()
    assert '<pre class="wf-json wf-json-full">{\n  &quot;comparison&quot;: {' in html  # pretty-printed evidence
    assert "better, mean difference +" in html
    listing = staff_client.get(reverse("admin:evals_promotion_changelist")).content.decode()
    assert "better, mean difference +" in listing and evaluated["better"].dsl_hash[:12] in listing
    result_page = staff_client.get(change_url("goldenresult", result.pk)).content.decode()
    assert result.grader in result_page and change_url("evalrun", evaluated["base_run"].pk) in result_page
    results = staff_client.get(reverse("admin:evals_goldenresult_changelist") + f"?q={evaluated['base_run'].pk}")
    assert {row.eval_run_id for row in results.context["cl"].result_list} == {evaluated["base_run"].pk}
    assert len(results.context["cl"].result_list) == 6


# ------------------------------------------------------------------------------ permissions and scope

def post_urls(evaluated) -> dict[str, tuple[str, dict]]:
    golden_set, run = evaluated["set"], evaluated["base_run"]
    return {
        "run": (set_url(golden_set, "run"), {"version": evaluated["better"].pk}),
        "import": (set_url(golden_set, "import"), {"format": "jsonl", "file": SimpleUploadedFile(
            "x.jsonl", b'{"input": "q"}')}),
        "promote": (set_url(golden_set, "promote"), {"version": evaluated["better"].pk}),
        "rollback": (set_url(golden_set, "rollback"), {"version": evaluated["better"].pk}),
        "cancel": (reverse("admin:evals_evalrun_cancel", args=[run.pk]), {}),
        "propose": (reverse("admin:evals_evalrun_propose", args=[run.pk]), {}),
    }


def assert_nothing_changed(evaluated):
    assert EvalRun.objects.count() == 2 and not Promotion.objects.exists()
    assert evaluated["set"].items.count() == 6
    assert WorkflowVersion.objects.get(pk=evaluated["base"].pk).status == "active"
    assert WorkflowVersion.objects.count() == 2


def test_post_views_need_post_csrf_and_the_change_permission(staff, evaluated, viewer_client):
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(staff)
    for name, (url, data) in post_urls(evaluated).items():
        if name != "import":  # the import page is a form: GET shows it
            assert checked.get(url).status_code == 405, name
        assert checked.post(url, data).status_code == 403, name  # no CSRF token
        assert viewer_client.post(url, data).status_code == 403, name
        assert Client().post(url, data).status_code == 302, name  # to the login page
    assert viewer_client.get(set_url(evaluated["set"], "import")).status_code == 403
    assert_nothing_changed(evaluated)
    # a viewer sees the pages without their buttons
    compare = viewer_client.get(compare_url(evaluated["set"], evaluated["base"], evaluated["better"])).content.decode()
    assert 'id="ev-verdict"' in compare and 'id="ev-promote"' not in compare
    assert "Promoting and rolling back need the permission to change golden sets." in compare
    run_page = viewer_client.get(change_url("evalrun", evaluated["base_run"].pk)).content.decode()
    assert 'id="ev-propose"' not in run_page and "need the permission to change eval runs" in run_page
    set_page = viewer_client.get(change_url("goldenset", evaluated["set"].pk)).content.decode()
    assert 'id="ev-run"' not in set_page and 'id="ev-import-link"' not in set_page


def test_another_workspaces_objects_are_absent_and_cannot_be_acted_on(outsider_client, evaluated):
    result = GoldenResult.objects.filter(eval_run=evaluated["base_run"]).first()
    promotion = Promotion.objects.create(workflow=evaluated["base"].workflow, workflow_version=evaluated["base"],
                                         action="rollback", evidence={"secret": "plan"})
    golden_set = evaluated["set"]
    for model, pk in (("goldenset", golden_set.pk), ("goldenitem", golden_set.items.first().pk),
                      ("evalrun", evaluated["base_run"].pk), ("goldenresult", result.pk), ("promotion", promotion.pk)):
        response = outsider_client.get(change_url(model, pk))
        assert response.status_code == 302 and response.url == reverse("admin:index"), model
        listing = outsider_client.get(reverse(f"admin:evals_{model}_changelist"))
        assert listing.status_code == 200 and not list(listing.context["cl"].result_list), model
    for url in (set_url(golden_set, "compare"), compare_url(golden_set, evaluated["base"], evaluated["better"]),
                set_url(golden_set, "import")):
        response = outsider_client.get(url)
        assert response.status_code == 302 and response.url == reverse("admin:index"), url
    promotion.delete()
    for name, (url, data) in post_urls(evaluated).items():
        response = outsider_client.post(url, data)
        assert response.status_code == 302 and response.url == reverse("admin:index"), name
    action = outsider_client.post(reverse("admin:evals_evalrun_changelist"), {
        "action": "cancel_eval_runs", "_selected_action": [evaluated["base_run"].pk]})
    assert action.status_code in (200, 302)
    assert_nothing_changed(evaluated)
    filters = outsider_client.get(reverse("admin:evals_evalrun_changelist")).content.decode()
    assert "support" not in filters and "Acme" not in filters  # not even as filter choices


# ------------------------------------------------------------------------------------------------- XSS

def test_user_text_is_escaped_on_every_page_and_in_the_svg(staff_client, workspace, make_version, evaluate):
    first = make_version(graph("agent", node("agent", prompt="Answer.")), name=XSS)
    second, _ = workflow_version_create(workflow=first.workflow, dsl=graph("agent", node("agent", prompt="Reply.")),
                                        commit_message=XSS_IMG)
    golden_set = golden_set_create(workspace=workspace, name=XSS, workflow=first.workflow, description=XSS_IMG,
                                   graders=[{"kind": "contains", "terms": [XSS_IMG]}])
    golden_item_add(golden_set=golden_set, input={"text": XSS}, expected_output=XSS_IMG, tags=["critical"])
    golden_item_add(golden_set=golden_set, input=XSS_IMG, expected_output=XSS, scoring_criteria=XSS)
    workflow_version_activate(version=first)
    runs = [evaluate(golden_set, first), evaluate(golden_set, second)]
    assert all(run.status == "completed" for run in runs)
    assert XSS_IMG in GoldenResult.objects.filter(eval_run=runs[0]).first().grading_rationale  # user text inside
    svg = str(charts.paired_svg([{"label": XSS, "a": 0.2, "b": 0.4, "critical_regression": False}],
                                label_a=XSS_IMG, label_b=XSS))
    assert "<script" not in svg and "<img" not in svg and ESCAPED in svg

    pages = {
        "set list": reverse("admin:evals_goldenset_changelist"),
        "set": change_url("goldenset", golden_set.pk),
        "import": set_url(golden_set, "import"),
        "compare": compare_url(golden_set, first, second),
        "run list": reverse("admin:evals_evalrun_changelist"),
        "run": change_url("evalrun", runs[0].pk),
        "results": reverse("admin:evals_goldenresult_changelist"),
        "result": change_url("goldenresult", GoldenResult.objects.filter(eval_run=runs[0]).first().pk),
    }
    for name, url in pages.items():
        response = staff_client.get(url)
        assert response.status_code == 200, name
        html = response.content.decode()
        assert XSS not in html and XSS_IMG not in html, name
        assert "&lt;script&gt;" in html or "&lt;img" in html, name
    compare = staff_client.get(pages["compare"])
    chart = str(compare.context["chart_svg"])
    assert "<script" not in chart and f"#1 {ESCAPED}" in chart  # the item's tooltip
    promoted = staff_client.post(set_url(golden_set, "promote"), {"version": second.pk})
    assert XSS not in "".join(messages_of(promoted))


# ---------------------------------------------------------------------------------------------- charts

def test_the_histogram_draws_ten_bins_with_counts_and_labelled_axes():
    bins = [{"low": i / 10, "high": (i + 1) / 10, "count": c} for i, c in enumerate([0, 1, 0, 0, 2, 0, 0, 0, 3, 7])]
    svg = str(charts.histogram_svg(bins))
    bars = re.findall(r'data-count="(\d+)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"', svg)
    assert [int(bar[0]) for bar in bars] == [0, 1, 0, 0, 2, 0, 0, 0, 3, 7]
    heights = [float(bar[4]) for bar in bars]
    assert heights[9] > heights[8] > heights[4] > heights[1] > 0 == heights[0]
    xs = [float(bar[1]) for bar in bars]
    assert xs == sorted(xs)
    ticks = re.findall(r'class="ev-tick" x="[\d.]+" y="[\d.]+" text-anchor="middle">([\d.]+)</text>', svg)
    assert ticks == ["0", "0.1", "0.2", "0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9", "1"]
    assert ">score</text>" in svg and ">items</text>" in svg
    assert "<title>Score histogram: 13 scored items</title>" in svg
    assert "0.9 to 1 (1 included): 7 items" in svg
    assert svg == str(charts.histogram_svg(bins))  # deterministic
    empty = str(charts.histogram_svg([{"low": i / 10, "high": (i + 1) / 10, "count": 0} for i in range(10)]))
    assert "no scored items" in empty and empty.count('class="ev-hist-bar"') == 10


def test_the_paired_chart_shares_a_line_between_equal_pairs_and_marks_critical_regressions():
    pairs = [{"label": f"item {n}", "a": 0.5, "b": 0.8, "critical_regression": False} for n in range(3)]
    pairs += [{"label": "worse", "a": 0.9, "b": 0.4, "critical_regression": False},
              {"label": "critical", "a": 0.6, "b": 0.3, "critical_regression": True},
              {"label": "same", "a": 1.0, "b": 1.0, "critical_regression": False},
              {"label": "unpaired", "a": 0.7, "b": None, "critical_regression": False}]
    svg = str(charts.paired_svg(pairs, label_a="a · base", label_b="b · better", mean_a=0.7, mean_b=0.64))
    groups = re.findall(r'<g class="(ev-pair[^"]*)" data-items="(\d+)" data-a="([\d.]+)" data-b="([\d.]+)">', svg)
    assert sorted(groups) == sorted([("ev-pair ev-pair-up", "3", "0.50", "0.80"),
                                     ("ev-pair ev-pair-down", "1", "0.90", "0.40"),
                                     ("ev-pair ev-pair-down ev-pair-critical", "1", "0.60", "0.30"),
                                     ("ev-pair ev-pair-same", "1", "1.00", "1.00")])
    assert groups[-1][0].endswith("ev-pair-critical")  # drawn last: on top
    assert "3 items: a 0.50 → b 0.80 (+0.30)\nitem 0\nitem 1\nitem 2" in svg
    assert "6 paired items: 3 higher in b, 2 lower, 1 equal · dashed: mean 0.700 → 0.640" in svg
    assert "unpaired" not in svg and 'class="ev-pair-mean"' in svg
    # a higher score is drawn higher: 0.8 sits above 0.5
    line = re.search(r'ev-pair-up".*?<line x1="\d+" y1="([\d.]+)" x2="\d+" y2="([\d.]+)"', svg, re.S)
    assert float(line.group(2)) < float(line.group(1))
    assert "no item scored by both versions" in str(charts.paired_svg([], label_a="a", label_b="b"))


# -------------------------------------------------------------------------------------- query budgets

def budget_scene(workspace, *, sets: int, items: int, runs: int):
    """Sets with items (through the services), two versions each with completed runs, a promotion."""
    workflow = workflow_create(workspace=workspace, name=f"budget {sets}-{items}")
    a, _ = workflow_version_create(workflow=workflow, dsl=graph("agent", node("agent", prompt="a")))
    b, _ = workflow_version_create(workflow=workflow, dsl=graph("agent", node("agent", prompt="b")))
    workflow_version_activate(version=a)
    made = []
    for number in range(sets):
        golden_set = golden_set_create(workspace=workspace, name=f"set {items}-{number}", workflow=workflow,
                                       graders=[{"kind": "token_f1"}])
        for index in range(items):
            golden_item_add(golden_set=golden_set, input={"text": f"question {index}"}, expected_output="answer",
                            tags=["critical"] if index % 3 == 0 else [])
        for _ in range(runs):
            completed_run(golden_set, a, lambda item: 0.5)
            completed_run(golden_set, b, lambda item: 0.9 if item.position % 2 else 0.4)
        Promotion.objects.create(workflow=workflow, workflow_version=b, previous_version=a, golden_set=golden_set,
                                 action="promote", evidence={"comparison": {"verdict": "better", "p_value": 0.01,
                                                                            "mean_diff": 0.2}})
        made.append(golden_set)
    return made, a, b


def test_changelists_query_count_does_not_grow_with_rows(staff_client, workspace):
    budget_scene(workspace, sets=1, items=2, runs=1)
    urls = [reverse(f"admin:evals_{model}_changelist") for model in ("goldenset", "evalrun", "goldenresult",
                                                                      "promotion", "goldenitem")]
    urls += [urls[1] + "?_facets=True", urls[0] + "?_facets=True", urls[4] + "?_facets=True&split__exact=test"]
    before = [count_queries(staff_client, url) for url in urls]
    budget_scene(workspace, sets=8, items=5, runs=3)
    assert [count_queries(staff_client, url) for url in urls] == before


def test_change_pages_query_count_does_not_grow_with_items_or_results(staff_client, workspace):
    [small], a, b = budget_scene(workspace, sets=1, items=3, runs=1)
    [large], a2, b2 = budget_scene(workspace, sets=1, items=40, runs=1)

    def pages(golden_set, version_a, version_b):
        run = EvalRun.objects.filter(golden_set=golden_set, workflow_version=version_b).get()
        return [change_url("goldenset", golden_set.pk), change_url("evalrun", run.pk),
                compare_url(golden_set, version_a, version_b),
                change_url("promotion", Promotion.objects.get(golden_set=golden_set).pk),
                change_url("goldenresult", GoldenResult.objects.filter(eval_run=run).first().pk),
                change_url("goldenitem", golden_set.items.first().pk)]

    for url in pages(small, a, b):  # content types and the like are cached after a first visit
        count_queries(staff_client, url)
    assert ([count_queries(staff_client, url) for url in pages(large, a2, b2)]
            == [count_queries(staff_client, url) for url in pages(small, a, b)])


def test_the_histogram_draws_the_pass_threshold():
    bins = [{"low": i / 10, "high": (i + 1) / 10, "count": 1} for i in range(10)]
    svg = str(charts.histogram_svg(bins, threshold=0.7))
    (line,) = re.findall(r'<line class="ev-threshold" x1="([\d.]+)" y1="[\d.]+" x2="([\d.]+)"', svg)
    bars = re.findall(r'class="ev-hist-bar" data-low="([\d.]+)" data-high="[\d.]+" data-count="\d+" x="([\d.]+)"', svg)
    x_of = {low: float(x) for low, x in bars}
    assert line[0] == line[1] and x_of["0.6"] < float(line[0]) < x_of["0.8"]  # at the 0.7 edge
    assert "pass ≥ 0.7" in svg
    assert 'class="ev-threshold"' not in str(charts.histogram_svg(bins))


def test_eval_run_page_has_a_column_per_grader_the_threshold_and_failed_or_critical_filters(staff_client, evaluated):
    run = evaluated["base_run"]
    html = staff_client.get(change_url("evalrun", run.pk)).content.decode()
    assert 'class="ev-threshold"' in html and "pass ≥ 0.7" in html
    assert '<th class="ev-grader-col">contains</th>' in html and '<th class="ev-grader-col">token_f1</th>' in html
    stored = {r.golden_item_id: r for r in GoldenResult.objects.filter(eval_run=run)}
    response = staff_client.get(change_url("evalrun", run.pk))
    for row in response.context["results"]:
        grades = {grade["kind"]: grade["score"] for grade in stored[row["item"]].grades}
        assert [cell for cell in row["grades"]] == [f"{grades['contains']:.3f}", f"{grades['token_f1']:.3f}"]
    assert all(r.passed is False for r in stored.values())  # the base fails every item
    failed = {r.golden_item_id for r in GoldenResult.objects.filter(eval_run=evaluated["better_run"])
              if r.passed is False or r.error}
    critical = set(evaluated["set"].items.filter(tags__contains=["critical"]).values_list("pk", flat=True))
    assert critical and failed != set(stored)
    for choice, expected in (("failed", failed), ("critical", critical), ("all", set(stored))):
        response = staff_client.get(change_url("evalrun", evaluated["better_run"].pk) + f"?results={choice}")
        assert {row["item"] for row in response.context["results"]} == expected, choice
        assert f'<a class="ev-filter ev-filter-on" href="?results={choice}">' in response.content.decode()
    response = staff_client.get(change_url("evalrun", run.pk) + "?results=<script>")
    assert response.status_code == 200 and {row["item"] for row in response.context["results"]} == set(stored)
    assert "<script>" not in response.content.decode().split('id="ev-result-filters"')[1][:400]


def test_compare_page_shows_both_outputs_per_item_and_the_prompt_diff(staff_client, evaluated):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    response = staff_client.get(compare_url(golden_set, base, better))
    html = response.content.decode()
    outputs_a = dict(GoldenResult.objects.filter(eval_run=evaluated["base_run"])
                     .values_list("golden_item", "actual_output"))
    outputs_b = dict(GoldenResult.objects.filter(eval_run=evaluated["better_run"])
                     .values_list("golden_item", "actual_output"))
    assert outputs_a != outputs_b
    for row in response.context["rows"]:
        assert row["output_a"]["text"] == outputs_a[row["item"]] and row["output_b"]["text"] == outputs_b[row["item"]]
    assert html.count('class="ev-text ev-out-a"') == 6 and html.count('class="ev-text ev-out-b"') == 6
    diff = response.context["version_diff"]
    assert diff["nodes"]["agent"]["change"] == "changed" and "systemPrompt" in diff["nodes"]["agent"]["fields"]
    assert 'id="ev-prompt-diff"' in html
    assert '<span class="ev-diff-add">+You are a helpful support agent. Call knowledge_search before answering.' in html
    assert '<span class="ev-diff-del">-You are a helpful support agent.</span>' in html
    assert "codeTools" in html  # the other fields that changed are named


def test_eval_run_page_survives_odd_graders_grades_and_threshold_in_an_old_runs_config(staff_client, evaluated):
    run = evaluated["base_run"]
    EvalRun.objects.filter(pk=run.pk).update(config={
        **run.config, "threshold": "0.7",
        "graders": ["contains", {"kind": "token_f1"}, {"kind": ["odd"]}, {"weight": 2}, {"kind": "token_f1"}]})
    results = list(GoldenResult.objects.filter(eval_run=run).order_by("pk"))
    odd_grades = [{"not": "a list"}, [{"kind": "token_f1", "score": "high"}], [None, {"kind": "token_f1"}],
                  [{"kind": "token_f1", "score": 0.25}, {"kind": "token_f1", "score": 0.75}]]
    for result, grades in zip(results, odd_grades, strict=False):
        GoldenResult.objects.filter(pk=result.pk).update(grades=grades)
    response = staff_client.get(change_url("evalrun", run.pk))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="ev-threshold"' not in html  # a threshold that is not a number draws no line
    assert '<th class="ev-grader-col">token_f1</th>' in html and html.count('class="ev-grader-col"') == 1
    cells = {row["item"]: row["grades"] for row in response.context["results"]}
    assert [cells[result.golden_item_id] for result in results[:4]] == [["-"], ["-"], ["-"], ["0.250"]]


def test_compare_page_escapes_answers_and_prompts(staff_client, evaluated):
    golden_set, base, better = evaluated["set"], evaluated["base"], evaluated["better"]
    GoldenResult.objects.filter(eval_run=evaluated["better_run"]).update(
        actual_output='<script>alert("answer")</script>' + "x" * 300)
    GoldenResult.objects.filter(eval_run=evaluated["base_run"]).update(actual_output="<b>short</b>")
    prompt = '<script>alert("prompt")</script>\nok'
    dsl = dict(better.dsl, nodes=[dict(node, systemPrompt=prompt) for node in better.dsl["nodes"]])
    WorkflowVersion.objects.filter(pk=better.pk).update(dsl=dsl)
    html = staff_client.get(compare_url(golden_set, base, better)).content.decode()
    assert "<script>alert(" not in html and "<b>short</b>" not in html
    assert "&lt;script&gt;alert(&quot;answer&quot;)&lt;/script&gt;" in html and "&lt;b&gt;short&lt;/b&gt;" in html
    assert '<span class="ev-diff-add">+&lt;script&gt;alert(&quot;prompt&quot;)&lt;/script&gt;</span>' in html
