"""The evals admin in a real browser (Debian's Chromium through Playwright, against live_server): the
golden set page (its splits, its items inline), the compare page of two evaluated versions (both scores per
item, the verdict, the paired chart) and a promotion through its button; the eval run page's histogram.
Screenshots land in the test's tmp_path."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.urls import reverse

from evals.models import GoldenResult
from tests.browser import assert_fits_the_screen, assert_readable, log_in
from tests.factories import MembershipFactory
from workflows.services import workflow_version_activate

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def scene(transactional_db, workspace, settings, facts, support_set, support_versions, evaluate):
    """Data is written before Playwright starts: its sync API switches greenlets, and ORM calls made
    inside it open connections of their own that outlive the test."""
    settings.DURABLE_DISPATCH_ENABLED = False  # eval runs are driven in-process; no worker needed
    operator = get_user_model().objects.create_user("operator", password="s3cret-pass", is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(content_type__app_label__in=("evals", "workflows")))
    MembershipFactory(user=operator, workspace=workspace)
    base, better = support_versions
    support_set.workflow = base.workflow
    support_set.save(update_fields=["workflow", "updated_at"])
    workflow_version_activate(version=base)
    base_run, better_run = evaluate(support_set, base), evaluate(support_set, better)
    assert base_run.status == better_run.status == "completed"
    scores = {run.pk: dict(GoldenResult.objects.filter(eval_run=run).values_list("golden_item", "score"))
              for run in (base_run, better_run)}
    return {"set": support_set, "base": base, "better": better, "base_run": base_run, "better_run": better_run,
            "scores": scores}


@pytest.fixture
def page(scene, browser_page):
    return browser_page


def test_operator_compares_two_versions_and_promotes_the_better_one(live_server, scene, page, tmp_path):
    log_in(page, live_server)

    # the golden set page: its items inline, the run form, its recent runs
    page.goto(live_server.url + reverse("admin:evals_goldenset_change", args=[scene["set"].pk]))
    page.locator("#ev-run-form").wait_for(state="visible")
    assert page.locator("#ev-recent-runs tr.ev-run-row").count() == 2
    assert page.locator("#items-group tr.has_original").count() == 6
    # six items are too few to hold a split out: the page says so; each item's split is a choice in its row
    assert page.locator("#ev-split-verdict").inner_text().startswith("No held-out claim: The set has 6 items")
    assert page.locator("#ev-split-table tr.ev-split-total th").all_inner_texts()[1:] == [
        str(scene["set"].items.filter(split=split).count()) for split in ("train", "validation", "test")]
    assert page.locator("#items-group tr.has_original select[name$='-split']").count() == 6
    page.screenshot(path=str(tmp_path / "golden-set.png"), full_page=True)
    assert_fits_the_screen(page)

    # its items by split: the section's link, then the list's split filter
    page.get_by_role("link", name="the items by split").click()
    page.get_by_role("link", name="Test", exact=True).click()
    page.wait_for_url("**split__exact=test**")
    assert page.locator("#result_list tbody tr").count() == scene["set"].items.filter(split="test").count() > 0
    assert set(page.locator("#result_list tbody td.field-split").all_inner_texts()) == {"Test"}
    page.screenshot(path=str(tmp_path / "golden-items.png"), full_page=True)
    assert_fits_the_screen(page)

    # the eval run page: a histogram of ten bars and a row per item
    page.goto(live_server.url + reverse("admin:evals_evalrun_change", args=[scene["better_run"].pk]))
    histogram = page.locator("#ev-histogram svg.ev-histogram")
    histogram.wait_for(state="visible")
    assert histogram.locator("rect.ev-hist-bar").count() == 10
    assert sum(int(histogram.locator("rect.ev-hist-bar").nth(i).get_attribute("data-count")) for i in range(10)) == 6
    assert page.locator("#ev-results-table tbody tr").count() == 6
    assert histogram.locator("line.ev-threshold").count() == 1
    assert page.locator("#ev-results-table th.ev-grader-col").count() >= 1
    page.screenshot(path=str(tmp_path / "eval-run.png"), full_page=True)
    assert_fits_the_screen(page)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "eval-run-dark.png")
    # its filters: critical items only, then back to all
    page.click("#ev-result-filters a:has-text('Critical only')")
    page.locator("#ev-result-filters a.ev-filter-on:has-text('Critical only')").wait_for()
    critical = scene["set"].items.filter(tags__contains=["critical"]).count()
    assert page.locator("#ev-results-table tbody tr").count() == critical
    page.screenshot(path=str(tmp_path / "eval-run-critical.png"), full_page=True)
    page.click("#ev-result-filters a:has-text('All')")
    page.locator("#ev-result-filters a.ev-filter-on:has-text('All')").wait_for()
    assert page.locator("#ev-results-table tbody tr").count() == 6

    # the compare page: both scores of every item, the verdict, the chart
    base, better = scene["base"], scene["better"]
    url = reverse("admin:evals_goldenset_compare", args=[scene["set"].pk]) + f"?a={base.pk}&b={better.pk}"
    page.goto(live_server.url + url)
    table = page.locator("#ev-compare-table")
    table.wait_for(state="visible")
    rows = table.locator("tbody tr.ev-item")
    assert rows.count() == 6
    for index in range(6):
        row = rows.nth(index)
        item = int(row.get_attribute("data-item"))
        a = scene["scores"][scene["base_run"].pk][item]
        b = scene["scores"][scene["better_run"].pk][item]
        assert row.locator("td.ev-score-a").inner_text() == f"{a:.3f}"
        assert row.locator("td.ev-score-b").inner_text() == f"{b:.3f}"
        assert row.locator("td.ev-diff").inner_text() == f"{b - a:+.3f}"
    assert page.locator("#ev-verdict").inner_text() == "better"
    chart = page.locator("#ev-paired-chart svg.ev-paired")
    assert chart.is_visible()
    pairs = chart.locator("g.ev-pair")
    assert sum(int(pairs.nth(i).get_attribute("data-items")) for i in range(pairs.count())) == 6
    box = chart.bounding_box()
    assert box["width"] >= 500 and box["height"] >= 300
    lines = [pairs.nth(i).locator("line").bounding_box() for i in range(pairs.count())]
    assert all(line["width"] > 200 for line in lines)  # each joins the a axis to the b axis
    # both answers of every item, and what changed between the versions
    assert table.locator("td.ev-out-a").count() == 6 and table.locator("td.ev-out-b").count() == 6
    assert page.locator("#ev-prompt-diff .ev-diff-add").count() >= 1
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    assert_fits_the_screen(page)
    assert_readable(page)
    assert_readable(page, dark=True, screenshot=tmp_path / "compare-dark.png")

    page.click("#ev-promote")
    page.wait_for_selector(".messagelist .success")
    assert f"Promoted {better.dsl_hash[:12]} to the active version" in page.locator(".messagelist").inner_text()
    assert page.locator("#ev-b-status").inner_text() == "Active"
    assert page.locator("#ev-promote").count() == 0
    assert page.locator("#ev-rollback").inner_text() == f"Roll back to {base.dsl_hash[:12]}"
    assert (tmp_path / "compare.png").stat().st_size > 10_000
