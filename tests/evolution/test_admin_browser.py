"""The evolution admin in a real browser (Debian's Chromium through Playwright, against live_server): a
finished run's page shows its held-out result (train / validation / test of base and best, the test lift
with its interval and paired test, the train-test gap), draws the fitness chart (a point per generation in
each series) and the genealogy (a node per version, each a link to its version's page), and Promote best
reports the promotion judged on the test split. Screenshots land in the test's tmp_path."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from evolution.models import Generation, Individual
from tests.browser import assert_fits_the_screen, assert_readable, log_in
from tests.factories import MembershipFactory
from workflows.services import workflow_version_activate

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def scene(transactional_db, workspace, settings, facts, held_out_set, support_base, evolve):
    """Data is written before Playwright starts: its sync API switches greenlets, and ORM calls made
    inside it open connections of their own that outlive the test."""
    settings.DURABLE_DISPATCH_ENABLED = False  # runs are driven in-process; no worker needed
    operator = get_user_model().objects.create_user("operator", password="s3cret-pass", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(
        content_type__app_label__in=("evolution", "evals", "workflows", "durable")))
    MembershipFactory(user=operator, workspace=workspace)
    run = evolve(support_base.workflow, held_out_set, config={"population": 3, "generations": 2, "seed": 1})
    assert run.status == "completed", run.error
    workflow_version_activate(version=run.base_version)  # the best has an active version to beat
    versions = set(Individual.objects.filter(evolution_run=run).values_list("workflow_version_id", flat=True))
    return {"run": run, "generations": Generation.objects.filter(evolution_run=run).count(), "versions": versions,
            "individuals": Individual.objects.filter(evolution_run=run).count(), "best": run.best_version}


@pytest.fixture
def page(scene, browser_page):
    return browser_page


def test_operator_reads_a_run_follows_the_genealogy_and_promotes_the_best(live_server, scene, page, tmp_path):
    log_in(page, live_server)

    # the list: the run with its status, and the way to start another
    page.goto(live_server.url + reverse("admin:evolution_evolutionrun_changelist"))
    page.locator("#result_list").wait_for(state="visible")
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.locator("#evo-start-link").is_visible()
    page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)
    assert_fits_the_screen(page)

    run = scene["run"]
    run_page = live_server.url + reverse("admin:evolution_evolutionrun_change", args=[run.pk])
    page.goto(run_page)

    # the held-out result, above the chart: base and best on each split, the lift on test, the gap
    report = page.locator("#evo-report")
    report.wait_for(state="visible")
    assert "(held-out test split)" in report.locator("h2").inner_text()
    assert [t.lower() for t in report.locator("#evo-report-table thead th").all_inner_texts()] == [
        "version", "train", "validation", "test"]  # the admin's table heads are drawn in capitals
    best_row = report.locator("tr.evo-report-best td").all_inner_texts()
    assert best_row == [f"{run.report['best'][split]:.2f}" for split in ("train", "validation", "test")]
    lift = report.locator("#evo-test-lift").inner_text()
    assert lift.startswith(f"{run.test_lift * 100:+.1f}%") and "95% interval" in lift
    assert report.locator("#evo-test-paired").inner_text().startswith("better: Wilcoxon p = 0.0312")
    assert report.locator("#evo-gap").is_visible()
    assert_fits_the_screen(page)
    report.screenshot(path=str(tmp_path / "report.png"))

    # the fitness chart: one point per generation in each of the three series
    chart = page.locator("#evo-fitness svg.evo-fitness")
    chart.wait_for(state="visible")
    for series in ("best", "avg", "worst"):
        assert chart.locator(f"circle.evo-point-{series}").count() == scene["generations"], series
    box = chart.bounding_box()
    assert box["width"] >= 600 and box["height"] >= 280
    best_points = [chart.locator("circle.evo-point-best").nth(i).bounding_box() for i in range(scene["generations"])]
    assert best_points[-1]["y"] < best_points[0]["y"]  # the best fitness rose: its last point sits higher

    # the genealogy: a node per version that took part
    graph = page.locator("#evo-genealogy svg.evo-genealogy")
    graph.wait_for(state="visible")
    nodes = graph.locator("a.evo-node")
    assert nodes.count() == len(scene["versions"])
    assert {int(nodes.nth(i).get_attribute("data-version")) for i in range(nodes.count())} == scene["versions"]
    assert graph.locator("a.evo-node-base").count() == 1 and graph.locator("a.evo-node-best").count() == 1
    assert page.locator("#evo-generations-table tr.evo-individual").count() == scene["individuals"]
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "run-dark.png")
    chart.screenshot(path=str(tmp_path / "fitness.png"))
    graph.screenshot(path=str(tmp_path / "genealogy.png"))

    # a node opens its version's page
    best = scene["best"]
    graph.locator("a.evo-node-best").click()
    page.wait_for_url(f"**{reverse('admin:workflows_workflowversion_change', args=[best.pk])}")
    assert best.dsl_hash in page.content()

    # Promote best: better than the active base, so it is promoted, and the page says so
    page.goto(run_page)
    page.click("#evo-promote")
    page.wait_for_selector(".messagelist .success")
    message = page.locator(".messagelist").inner_text()
    assert f"Promoted {best.dsl_hash[:12]} (the run's best" in message and "Evidence: verdict better" in message
    assert "paired items of the test split" in message
    assert page.locator("#evo-promote").count() == 0 and page.locator("#evo-best-active").is_visible()
    page.screenshot(path=str(tmp_path / "promoted.png"), full_page=True)
    assert (tmp_path / "run.png").stat().st_size > 10_000
