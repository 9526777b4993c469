"""The operator console's home (`/admin/`): the numbers of the window for seeded rows, the window switch, the
lists its numbers open, the user's workspace scope, its query budget, and the app list below it, grouped
and named as an operator works."""

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from durable.models import DurableRun
from evals.models import EvalRun
from evals.services import golden_set_create
from evolution.models import EvolutionRun
from tests.admin_users import admin_staff, client_of
from tests.builders import graph, node
from tests.factories import WorkspaceFactory
from workflows.models import NodeInvocation, WorkflowInvocation
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create

pytestmark = pytest.mark.django_db

APPS = ("workspaces", "durable", "workflows", "evals", "evolution", "knowledge", "auth", "knox")


def ago(**delta):
    return timezone.now() - timedelta(**delta)


def runs(workspace, status: str, count: int, *, created, prefix: str = ""):
    made = DurableRun.objects.bulk_create([
        DurableRun(id=f"{prefix or workspace.slug}-{status}-{created.timestamp():.0f}-{index}",
                   workflow="tests.sequence", namespace=workspace.namespace, status=status)
        for index in range(count)])
    DurableRun.objects.filter(pk__in=[run.pk for run in made]).update(created_at=created)
    return made


def version_of(workspace, name: str, *, model: str = "gpt-4.1-mini"):
    workflow = workflow_create(workspace=workspace, name=name)
    version, _ = workflow_version_create(workflow=workflow, dsl=graph("a", node("a", model=model)))
    return version


def invocation(version, status: str, *, created, cost: str = "0", tokens=(0, 0), error: str = ""):
    made = WorkflowInvocation.objects.create(
        workspace=version.workflow.workspace, workflow_version=version, status=status, usd_budget=Decimal("1"),
        usd_cost=Decimal(cost), input_tokens=tokens[0], output_tokens=tokens[1], error=error)
    WorkflowInvocation.objects.filter(pk=made.pk).update(created_at=created)
    made.refresh_from_db()
    return made


def node_run(invocation_, seq: int, *, model: str, cost: str, tokens=(0, 0), status="completed", started=None):
    return NodeInvocation.objects.create(
        workflow_invocation=invocation_, seq=seq, node_id=f"n{seq}", status=status, model=model,
        usd_cost=Decimal(cost), input_tokens=tokens[0], output_tokens=tokens[1], llm_calls=1,
        started_at=started or timezone.now())


@pytest.fixture
def acme(db):
    return WorkspaceFactory(name="Acme", slug="acme")


@pytest.fixture
def globex(db):
    return WorkspaceFactory(name="Globex", slug="globex")


@pytest.fixture
def superuser_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.test", "x"))
    return client


@pytest.fixture
def seeded(acme):
    """Acme's last days: runs of every kind in the window and older ones, two workflows with spend on two
    models, a failure with its error, a node waiting for approval, eval runs of the active version and an
    evolution in progress."""
    runs(acme, "failed", 3, created=ago(hours=2))
    runs(acme, "dead", 1, created=ago(hours=3))
    runs(acme, "suspended", 2, created=ago(minutes=20))
    runs(acme, "completed", 4, created=ago(hours=5))
    runs(acme, "failed", 5, created=ago(days=3))  # outside the default 24 h, inside 7 d
    research = version_of(acme, "research")
    support = version_of(acme, "support", model="gpt-4.1")
    done = invocation(research, "completed", created=ago(hours=1), cost="0.0300", tokens=(1200, 300))
    node_run(done, 1, model="gpt-4.1-mini", cost="0.0100", tokens=(700, 100))
    node_run(done, 2, model="gpt-4.1", cost="0.0200", tokens=(500, 200))
    invocation(research, "failed", created=ago(hours=4), error="older failure")
    invocation(research, "failed", created=ago(hours=2), error="ToolError: search timed out after 30 s")
    waiting = invocation(support, "waiting", created=ago(hours=6), cost="1.5", tokens=(10_000, 2_000))
    node_run(waiting, 1, model="gpt-4.1", cost="1.5", tokens=(10_000, 2_000), status="waiting",
             started=ago(minutes=45))
    invocation(support, "failed", created=ago(days=2), error="outside the window")
    golden = golden_set_create(workspace=acme, name="support golden", workflow=support.workflow)
    workflow_version_activate(version=support)
    for hours, score in ((30, 0.5), (20, 0.625), (10, 0.75)):
        EvalRun.objects.create(workspace=acme, golden_set=golden, workflow_version=support, status="completed",
                               avg_score=score, pass_rate=score, ended_at=ago(hours=hours))
    EvolutionRun.objects.create(workspace=acme, workflow=support.workflow, golden_set=golden, base_version=support,
                                status="running", base_fitness=40.0, best_fitness=52.5, generations_done=2,
                                config={"generations": 5})
    return {"research": research, "support": support, "waiting": waiting, "golden": golden}


def legend(html: str, section: str) -> dict[str, str]:
    """The status numbers of a chart's legend: {status: count}."""
    card = re.search(rf'<section class="module home-card" id="home-{section}">(.*?)</section>', html, re.S).group(1)
    return dict((status, count) for status, count in
                re.findall(r'<a href="[^"]*" data-status="(\w+)">(\d+)</a>', card))


def legend_link(html: str, section: str, status: str) -> str:
    card = re.search(rf'id="home-{section}">(.*?)</section>', html, re.S).group(1)
    return unescape(re.search(rf'<a href="([^"]*)" data-status="{status}">', card).group(1))


def card(html: str, section: str) -> str:
    return re.search(rf'<section class="module home-card" id="home-{section}">(.*?)</section>', html, re.S).group(1)


# ---------------------------------------------------------------------------------------------- numbers

def test_home_counts_the_windows_runs_and_invocations_by_status(superuser_client, seeded):
    html = superuser_client.get(reverse("admin:index")).content.decode()
    assert legend(html, "runs") == {"failed": "3", "dead": "1", "suspended": "2", "completed": "4"}
    assert legend(html, "invocations") == {"failed": "2", "waiting": "1", "completed": "1"}
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="home-status-chart"' in html


def test_the_window_switch_widens_the_counts(superuser_client, seeded):
    html = superuser_client.get(reverse("admin:index"), {"window": "7d"}).content.decode()
    assert legend(html, "runs")["failed"] == "8"
    assert legend(html, "invocations")["failed"] == "3"
    assert re.search(r'<strong class="home-window home-window-current" aria-current="true">7 d</strong>', html)
    for key in ("1h", "24h", "30d"):
        assert f'href="?window={key}"' in html
    hour = superuser_client.get(reverse("admin:index"), {"window": "1h"}).content.decode()
    assert legend(hour, "runs") == {"failed": "0", "dead": "0", "suspended": "2"}


def test_an_unknown_window_is_named_and_the_default_shown(superuser_client, seeded):
    response = superuser_client.get(reverse("admin:index"), {"window": "forever"})
    assert response.status_code == 200
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Unknown window='forever': choose one of 1h, 24h, 7d, 30d. Showing the last 24 h."]
    assert legend(response.content.decode(), "runs")["failed"] == "3"


def test_each_number_opens_the_list_of_its_rows(superuser_client, seeded):
    html = superuser_client.get(reverse("admin:index")).content.decode()
    failed_runs = superuser_client.get(legend_link(html, "runs", "failed"))
    assert failed_runs.status_code == 200
    assert failed_runs.context["cl"].result_count == 3
    assert {run.status for run in failed_runs.context["cl"].result_list} == {"failed"}
    waiting = superuser_client.get(legend_link(html, "invocations", "waiting"))
    assert [row.pk for row in waiting.context["cl"].result_list] == [seeded["waiting"].pk]
    # a bar of the chart opens its bucket's rows of its status
    bar = unescape(re.search(r'<a href="([^"]*)" class="home-bar home-bar-dead">', html).group(1))
    assert superuser_client.get(bar).context["cl"].result_count == 1


def test_spend_by_model_workflow_and_day(superuser_client, seeded):
    html = superuser_client.get(reverse("admin:index")).content.decode()
    by_model = card(html, "spend-model")
    # gpt-4.1: the completed invocation's 0.02 and the waiting node's 1.50; the mini model 0.01
    rows = re.findall(r'<td class="home-wrap">([^<]+)</td><td class="home-num">(\d+)</td>'
                      r'<td class="home-num"><a href="([^"]+)">([^<]+)</a></td><td class="home-num">([^<]+)</td>',
                      by_model)
    assert [(model, calls, cost, tokens) for model, calls, _url, cost, tokens in rows] == [
        ("gpt-4.1", "2", "$1.52", "10,500 / 2,200"), ("gpt-4.1-mini", "1", "$0.0100", "700 / 100")]
    model_list = superuser_client.get(unescape(rows[0][2]))
    assert {node.model for node in model_list.context["cl"].result_list} == {"gpt-4.1"}
    assert model_list.context["cl"].result_count == 2
    by_workflow = card(html, "spend-workflow")
    assert re.findall(r'<td class="home-wrap">(\w+)</td><td class="home-num">(\d+)</td>'
                      r'<td class="home-num"><a href="[^"]+">([^<]+)</a>', by_workflow) == [
        ("support", "1", "$1.50"), ("research", "3", "$0.0300")]
    by_day = card(html, "spend-day")
    days = re.findall(r"<td>(\d{4}-\d\d-\d\d)</td><td class=\"home-num\">(\d+)</td>"
                      r"<td class=\"home-num\">([^<]+)</td>", by_day)
    assert sum(int(count) for _day, count, _cost in days) == 4
    assert sum(Decimal(cost.strip("$").replace(",", "")) for _day, _count, cost in days) == Decimal("1.53")


def test_approvals_failures_trends_and_evolutions(superuser_client, seeded):
    html = superuser_client.get(reverse("admin:index")).content.decode()
    approvals = card(html, "approvals")
    assert '<span class="home-count home-alert">1</span>' in approvals
    waiting = seeded["waiting"]
    assert re.search(rf'<td>support</td><td>n1</td>\s*<td><a href="/admin/workflows/workflowinvocation/{waiting.pk}'
                     rf'/change/#approval-1">{waiting.pk}</a></td><td class="home-num">45\.\d min</td>', approvals)
    failing = card(html, "failing")
    assert re.search(r'<td>research</td>\s*<td class="home-num"><a href="[^"]+" class="home-alert-text">2</a>'
                     r'<span class="home-muted"> of 3</span></td>', failing)
    assert "ToolError: search timed out after 30 s" in failing
    assert "older failure" not in failing and "outside the window" not in failing
    failed_list = unescape(re.search(r'<a href="([^"]+)" class="home-alert-text">', failing).group(1))
    assert superuser_client.get(failed_list).context["cl"].result_count == 2
    trends = card(html, "trends")
    assert re.search(r'>support</a></td><td class="home-wrap">support golden</td>', trends)
    assert '<td class="home-num">0.750</td>' in trends and "+0.125" in trends
    assert "support golden: 0.500, 0.625, 0.750" in trends  # the sparkline's title, oldest first
    evolutions = card(html, "evolutions")
    assert re.search(r"<td>running</td><td class=\"home-num\">2 / 5</td>\s*<td class=\"home-num\">52.50"
                     r"<span class=\"home-muted\"> from 40.00</span></td><td class=\"home-num\">\+31.2%</td>",
                     evolutions)
    # the counts' own links: every waiting node, every evolution in progress
    for section, count in (("approvals", 1), ("evolutions", 1)):
        url = unescape(re.search(r'<h2><a href="([^"]+)">', card(html, section)).group(1))
        assert superuser_client.get(url).context["cl"].result_count == count, section


# ------------------------------------------------------------------------------------------------ scope

def test_a_staff_member_of_another_workspace_sees_nothing_of_acmes(seeded, globex):
    html = client_of(admin_staff("globex-staff", globex, apps=APPS)).get(reverse("admin:index")).content.decode()
    assert legend(html, "runs") == {"failed": "0", "dead": "0", "suspended": "0"}
    assert legend(html, "invocations") == {"failed": "0", "waiting": "0"}
    for text in ("research", "support", "gpt-4.1", "ToolError", "$1.50", "52.50"):
        assert text not in html.split('<h2 class="home-apps-title">')[0], text
    assert '<span class="home-count">0</span>' in card(html, "approvals")


def test_a_staff_member_of_acme_sees_acmes_numbers(seeded, acme, globex):
    runs(globex, "failed", 7, created=ago(hours=1))
    html = client_of(admin_staff("acme-staff", acme, apps=APPS)).get(reverse("admin:index")).content.decode()
    assert legend(html, "runs")["failed"] == "3"


def test_a_section_whose_list_the_user_may_not_view_is_left_out(seeded, acme):
    html = client_of(admin_staff("runs-only", acme, apps=("durable",))).get(reverse("admin:index")).content.decode()
    assert legend(html, "runs")["failed"] == "3"
    for section in ("invocations", "approvals", "failing", "spend-model", "trends", "evolutions"):
        assert f'id="home-{section}"' not in html


# --------------------------------------------------------------------------------------------- budget

def _queries(client) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(reverse("admin:index")).status_code == 200
    return len(captured)


def test_the_home_reads_in_a_fixed_number_of_queries(superuser_client, acme, seeded):
    few = _queries(superuser_client)
    assert few <= 14
    for index in range(6):  # more of everything: the count of queries stays
        version = version_of(acme, f"more {index}", model=f"model-{index}")
        made = invocation(version, "failed", created=ago(hours=index + 1), error=f"error {index}")
        node_run(made, 1, model=f"model-{index}", cost="0.01", status="waiting")
        runs(acme, "dead", 3, created=ago(hours=index + 1), prefix=f"more-{index}")
        EvolutionRun.objects.create(workspace=acme, workflow=version.workflow, golden_set=seeded["golden"],
                                    base_version=seeded["support"], status="paused")
    assert _queries(superuser_client) == few


def test_a_staff_members_home_has_the_same_budget(acme, seeded):
    staff = client_of(admin_staff("acme-staff", acme, apps=APPS))
    few = _queries(staff)
    runs(acme, "failed", 20, created=ago(hours=1), prefix="many")
    assert _queries(staff) == few <= 16


# ------------------------------------------------------------------------------------------- app list

def test_the_app_list_comes_below_grouped_as_an_operator_works(superuser_client):
    html = superuser_client.get(reverse("admin:index")).content.decode()
    _home, apps = html.split('<h2 class="home-apps-title">')
    captions = re.findall(r'<caption>\s*<a href="[^"]*" class="section"[^>]*>([^<]+)</a>', apps)
    assert captions == ["Workflows", "Evaluations", "Evolution", "Knowledge", "Durable runs", "Access"]
    access = apps.split(">Access</a>")[1].split("</table>")[0]
    assert re.findall(r'<th scope="row" id="[\w-]+">\s*<a href="[^"]+">([^<]+)</a>', access) == [
        "Workspaces", "Memberships", "Users", "Groups", "API tokens"]
    assert "Knox" not in html and "Auth tokens" not in html
    workflows = apps.split(">Workflows</a>", 1)[1].split("</table>")[0]
    names = re.findall(r'<th scope="row" id="[\w-]+">\s*<a href="[^"]+">([^<]+)</a>', workflows)
    assert names[:3] == ["Workflows", "Workflow versions", "Workflow invocations"]


def test_an_apps_own_page_keeps_its_models_and_the_token_apps_name(superuser_client):
    html = superuser_client.get(reverse("admin:app_list", args=["knox"])).content.decode()
    assert "API tokens" in html and "Knox" not in html
    durable = superuser_client.get(reverse("admin:app_list", args=["durable"])).content.decode()
    assert "Durable runs" in durable and "Workflows</a>" not in durable
