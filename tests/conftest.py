"""Shared fixtures: three fixed users for permission tests (owner, member, outsider)."""

import shutil
from pathlib import Path

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from workspaces.models import Membership

CHROMIUM = "/usr/bin/chromium"


def pytest_report_header(config):
    if shutil.which("chromium") is None:
        return ["NOTICE: Debian's chromium is not installed: browser tests will be SKIPPED "
                "(apt-get install chromium, or run .ci/run, to include them)."]
    return ["chromium: " + CHROMIUM]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if shutil.which("chromium") is None:
        terminalreporter.write_line(
            "NOTICE: browser tests were skipped because Debian's chromium is not installed.", yellow=True
        )


@pytest.fixture(autouse=True)
def _empty_cache():
    """Each test starts with an empty cache (the API's throttle counts, the tick heartbeat, worker pings):
    every test client comes from 127.0.0.1, so counts would carry over from one test to the next."""
    cache.clear()


@pytest.fixture
def workspace(db):
    return WorkspaceFactory(name="Acme", slug="acme")


@pytest.fixture
def other_workspace(db):
    return WorkspaceFactory(name="Globex", slug="globex")


@pytest.fixture
def owner(workspace):
    user = UserFactory(username="owner")
    MembershipFactory(user=user, workspace=workspace, role=Membership.Role.OWNER)
    return user


@pytest.fixture
def member(workspace):
    user = UserFactory(username="member")
    MembershipFactory(user=user, workspace=workspace, role=Membership.Role.MEMBER)
    return user


@pytest.fixture
def outsider(other_workspace):
    """Signed in, but a member only of another workspace."""
    user = UserFactory(username="outsider")
    MembershipFactory(user=user, workspace=other_workspace, role=Membership.Role.OWNER)
    return user


@pytest.fixture
def api():
    return APIClient()


@pytest.fixture
def api_as(api):
    def login(user):
        api.force_authenticate(user=user)
        return api

    return login


@pytest.fixture
def browser_page(monkeypatch):
    """A page in Debian's Chromium driven by Playwright (skipped, with the reason, where it is absent).
    Request it after any fixture that writes data: Playwright's sync API runs an event loop in this
    thread, and ORM calls made inside it open connections of their own."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    from tests.browser import HEIGHT, WIDTH

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        finally:
            browser.close()


# ---- workflows ----


@pytest.fixture
def make_version(workspace):
    """A workflow version of `workspace` from a DSL document (a new workflow each call)."""
    from workflows.services import workflow_create, workflow_version_create

    counter = {"n": 0}

    def make(dsl: dict, *, name: str | None = None, workspace_=None):
        counter["n"] += 1
        workflow = workflow_create(workspace=workspace_ or workspace, name=name or f"workflow {counter['n']}")
        version, _ = workflow_version_create(workflow=workflow, dsl=dsl)
        return version

    return make


@pytest.fixture
def version_stored_with_an_unusable_schema(make_version):
    """A version as an installation upgraded past the write check of schemas holds it: stored before that check,
    its inputSchema ({"type": "strng"}) is not a usable JSON Schema."""
    from tests.builders import graph, node
    from workflows.models import WorkflowVersion

    version = make_version(graph("a", node("a", prompt="Answer.")))
    unusable = {"type": "strng"}
    WorkflowVersion.objects.filter(pk=version.pk).update(dsl={**version.dsl, "inputSchema": unusable},
                                                         input_schema=unusable)
    version.refresh_from_db()
    return version


@pytest.fixture
def invoke():
    """Start an invocation of a version and drive its durable run in-process until it ends or
    waits for the outside world; returns the refreshed invocation."""
    from durable.inprocess import run_until_settled
    from workflows.services import invocation_start

    def run(version, input=None, **kwargs):
        invocation = invocation_start(version=version, input=input if input is not None else {"text": "hello"},
                                      **kwargs)
        run_until_settled(invocation.durable_run_id, max_wait=30)
        invocation.refresh_from_db()
        return invocation

    return run


@pytest.fixture
def settle():
    from durable.inprocess import run_until_settled

    def drive(invocation):
        run_until_settled(invocation.durable_run_id, max_wait=30)
        invocation.refresh_from_db()
        return invocation

    return drive
