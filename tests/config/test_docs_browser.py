"""The API documentation renders in a real browser, from the project's own static files (no CDN)."""

import pytest
from django.contrib.auth import get_user_model

from tests.browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def operator(transactional_db):
    return get_user_model().objects.create_superuser("operator", "operator@example.test", "s3cret-pass")


def test_swagger_ui_renders_the_schema_offline(live_server, operator, browser_page):
    external = []
    browser_page.on("request", lambda request: external.append(request.url)
                    if not request.url.startswith(live_server.url) else None)
    log_in(browser_page, live_server)
    browser_page.goto(live_server.url + "/api/docs/")
    browser_page.wait_for_selector(".info .title", timeout=20_000)
    assert "Lineage API" in browser_page.inner_text(".info .title")
    assert browser_page.locator(".opblock-tag", has_text="durable").count() == 1
    assert [url for url in external if not url.startswith("data:")] == []
