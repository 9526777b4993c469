"""The operator console's home in a real browser: Debian's Chromium driven by Playwright against live_server."""

import pytest
from django.contrib.auth import get_user_model

from evals.models import EvalRun
from evals.services import golden_set_create
from evolution.models import EvolutionRun
from tests.browser import assert_fits_the_screen, assert_readable, log_in
from tests.config.test_admin_home import ago, invocation, node_run, runs, version_of
from workflows.services import workflow_version_activate

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def busy_day(transactional_db):
    """A day of two workspaces' work, written before Playwright starts (its sync API switches greenlets, and
    ORM calls made inside it open connections of their own that outlive the test)."""
    from tests.factories import WorkspaceFactory

    get_user_model().objects.create_superuser("operator", "operator@example.test", "s3cret-pass")
    acme = WorkspaceFactory(name="Acme", slug="acme")
    for hours in range(0, 24, 2):
        runs(acme, "completed", 3 + hours % 5, created=ago(hours=hours, minutes=10))
        runs(acme, "running", 1, created=ago(hours=hours, minutes=5))
    runs(acme, "failed", 4, created=ago(hours=3))
    runs(acme, "dead", 1, created=ago(hours=7))
    runs(acme, "suspended", 2, created=ago(minutes=30))
    research = version_of(acme, "customer-research-with-a-long-workflow-name")
    support = version_of(acme, "support", model="openrouter#anthropic/claude-3.5-sonnet")
    for index in range(5):
        made = invocation(research, "completed", created=ago(hours=index * 4 + 1), cost="0.0270", tokens=(900, 250))
        node_run(made, 1, model="gpt-4.1-mini", cost="0.0270", tokens=(900, 250))
    failed = invocation(research, "failed", created=ago(hours=2),
                        error="ToolError: knowledge_search timed out after 30 s while reading the source "
                              "'quarterly-report-2026.pdf' (page 41 of 120)")
    node_run(failed, 1, model="gpt-4.1-mini", cost="0.0040", status="failed")
    waiting = invocation(support, "waiting", created=ago(hours=5), cost="0.4100", tokens=(12_000, 3_100))
    node_run(waiting, 1, model="openrouter#anthropic/claude-3.5-sonnet", cost="0.4100", tokens=(12_000, 3_100),
             status="waiting", started=ago(hours=4, minutes=40))
    golden = golden_set_create(workspace=acme, name="support golden", workflow=support.workflow)
    workflow_version_activate(version=support)
    for index, score in enumerate((0.52, 0.61, 0.58, 0.70, 0.74, 0.81)):
        EvalRun.objects.create(workspace=acme, golden_set=golden, workflow_version=support, status="completed",
                               avg_score=score, pass_rate=score, ended_at=ago(days=6 - index))
    EvolutionRun.objects.create(workspace=acme, workflow=support.workflow, golden_set=golden, base_version=support,
                                status="running", base_fitness=61.0, best_fitness=74.25, generations_done=3,
                                config={"generations": 8})
    return {"failed_runs": 4}


@pytest.fixture
def page(busy_day, browser_page):
    return browser_page


def test_operator_opens_the_home_and_follows_a_number_to_its_list(live_server, busy_day, page, tmp_path):
    log_in(page, live_server, then="#home")

    assert page.locator("#home-runs svg.home-status-chart").is_visible()
    page.screenshot(path=str(tmp_path / "home.png"), full_page=True)
    assert_fits_the_screen(page)

    # the admin's dark theme keeps the charts' text and axes readable (they draw in currentColor)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "home-dark.png")

    page.click("#home-windows >> text=7 d")
    page.wait_for_selector(".home-window-current >> text=7 d")
    page.screenshot(path=str(tmp_path / "home-7d.png"), full_page=True)
    assert_fits_the_screen(page)

    page.click("#home-runs a[data-status=failed]")
    page.wait_for_selector("#result_list")
    assert page.locator("#result_list tbody tr").count() == busy_day["failed_runs"]
    assert "status__exact=failed" in page.url and "created_at__gte=" in page.url
    page.screenshot(path=str(tmp_path / "home-failed-runs.png"), full_page=True)
