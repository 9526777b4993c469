"""The runs admin in a real browser: Debian's Chromium driven by Playwright against live_server."""


import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.urls import reverse

from durable.inprocess import run_until_settled
from durable.services import run_start
from tests.browser import assert_fits_the_screen, assert_readable, log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def finished_run(transactional_db):
    """Data is written before Playwright starts: its sync API switches greenlets, and ORM calls made
    inside it open connections of their own that outlive the test."""
    get_user_model().objects.create_superuser("operator", "operator@example.test", "s3cret-pass")
    run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 3}).id)
    assert run.status == "completed"
    # ids as the list shows them on a running installation: a schedule's window, a nested child
    run_start(workflow="tests.sequence", input={"steps": 1}, namespace="ws-12",
              run_id="sched:ws-12:evals-reevaluate-nightly:2026-12-01T02:00:00+00:00")
    run_start(workflow="tests.sequence", input={"steps": 1}, namespace="ws-12",
              run_id="evolution-run-41/3/17/2.4/wfi-90412/5")
    return run


@pytest.fixture
def page(finished_run, browser_page):
    return browser_page


def test_operator_sees_the_runs_and_a_run_timeline(live_server, finished_run, page, tmp_path):
    run = finished_run

    log_in(page, live_server)

    page.goto(live_server.url + reverse("admin:durable_durablerun_changelist"))
    assert page.locator("#result_list").is_visible()
    page.screenshot(path=str(tmp_path / "durable-runs.png"), full_page=True)
    assert_fits_the_screen(page)
    page.click(f"text={run.id}")

    timeline = page.locator("#durable-timeline")
    timeline.wait_for(state="visible")
    assert timeline.locator("tbody tr").count() == 3
    assert "add-2" in timeline.inner_text()
    assert page.url.endswith(reverse("admin:durable_durablerun_change", args=[quote(run.id)]))


@pytest.fixture
def failed_run(transactional_db):
    get_user_model().objects.create_superuser("operator", "operator@example.test", "s3cret-pass")
    parent = run_until_settled(run_start(workflow="tests.parent", input={}).id)
    run = run_until_settled(run_start(workflow="tests.fan_failing", input={}).id)
    assert run.status == "failed" and parent.status == "completed"
    return run


def test_operator_retries_a_failed_run_from_its_page(live_server, failed_run, browser_page, tmp_path):
    page, run = browser_page, failed_run
    log_in(page, live_server)
    page.goto(live_server.url + reverse("admin:durable_durablerun_change", args=[quote(run.id)]))
    page.locator("#durable-gantt svg").wait_for(state="visible")
    assert page.locator(".durable-traceback").first.is_visible()
    assert page.locator("#durable-cancel").count() == 0
    page.screenshot(path=str(tmp_path / "durable-run-failed.png"), full_page=True)
    assert_fits_the_screen(page)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "durable-run-failed-dark.png")

    page.click("#durable-retry")
    page.wait_for_selector("ul.messagelist li.success")
    assert f"Retried run {run.id}" in page.locator("ul.messagelist").inner_text()
    assert page.url.endswith(reverse("admin:durable_durablerun_change", args=[quote(run.id)]))
    assert page.locator("#durable-retry").count() == 0  # pending now: cancel and signal instead
    assert page.locator("#durable-cancel").is_visible()
    assert "The attempt it ended: failed" in page.locator("#durable-log").inner_text()
    page.screenshot(path=str(tmp_path / "durable-run-retried.png"), full_page=True)
    assert_fits_the_screen(page)

    page.goto(live_server.url + reverse("admin:durable_durablerun_changelist") + "?children=show")
    page.screenshot(path=str(tmp_path / "durable-runs-with-children.png"), full_page=True)
    assert_fits_the_screen(page)
