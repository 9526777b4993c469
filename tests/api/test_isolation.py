"""Workspace isolation, walked from the schema: the outsider (A) owns one object of every kind; the
owner (B, of another workspace) tries every operation on A's ids (details, actions, deletes), every list
filter with A's ids and text, and every write naming A's workspace or A's objects. B gets 404 / 403 / 400
(a list may answer 200 without A's rows), never A's data in a body, and A's objects are unchanged.
An endpoint added later is covered as soon as it is in the schema."""

import json

import pytest

from tests.api.schema import collections, operations, request_properties

pytestmark = pytest.mark.django_db

REFUSED = {400, 403, 404, 405}


@pytest.fixture
def a_side(world, object_ids, outsider, other_workspace):
    ids = object_ids(outsider)
    missing = sorted(set(collections()) - set(ids))
    assert missing == [], f"make_world (tests/api/conftest.py) creates no object the outsider can list at {missing}"
    return {"ids": ids, "marker": world["theirs"], "workspace": other_workspace}


def snapshot(client, ids) -> str:
    """Everything A can read about A's objects, as A sees it."""
    seen = {}
    for op in operations(method="get"):
        url = op.url(ids[op.collection]) if op.is_detail else op.path
        response = client.get(url)
        if response.status_code == 200:
            seen[url] = response.json()
    return json.dumps(seen, sort_keys=True)


def leaks(response, a_side, sent: str = "") -> list[str]:
    """A's texts in a response (an error message quoting the caller's own input is not a leak)."""
    text = response.content.decode(errors="replace")
    if sent:
        text = text.replace(sent, "").replace(json.dumps(sent)[1:-1], "")
    return [secret for secret in (a_side["marker"], "Globex", "outsider") if secret in text]


def _body_values(op, a_side, workspace_id) -> dict:
    """A body for `op` naming A's objects: ids where the schema wants numbers, A's ids in lists."""
    any_id = int(next(value for value in a_side["ids"].values() if value.isdigit()))
    body = {}
    for name, spec in request_properties(op).items():
        kind = spec.get("type")
        if name == "workspace":
            body[name] = workspace_id
        elif kind == "integer":
            body[name] = any_id
        elif kind == "array":
            body[name] = [any_id]
        elif kind == "boolean":
            body[name] = True
        elif kind == "object" or "type" not in spec:
            body[name] = {"source_id": any_id, "run_id": a_side["ids"]["/api/durable/runs/"]}
        else:
            body[name] = a_side["ids"]["/api/durable/runs/"] if name in ("run_id", "parent") else "x"
    return body


def test_another_workspaces_objects_answer_nothing_through_any_operation(api_as, owner, outsider, workspace,
                                                                         a_side):
    before = snapshot(api_as(outsider), a_side["ids"])
    client = api_as(owner)
    problems = []
    for op in operations():
        if not op.is_detail:
            continue
        url = op.url(a_side["ids"][op.collection])
        body = json.dumps(_body_values(op, a_side, workspace.pk)) if op.method in ("post", "put", "patch") else ""
        for fmt in ("json", "api"):
            response = getattr(client, op.method)(f"{url}?format={fmt}", data=body, content_type="application/json")
            if response.status_code not in REFUSED or leaks(response, a_side):
                problems.append(f"{op} as {fmt}: {response.status_code} {leaks(response, a_side)}")
    assert problems == []
    assert snapshot(api_as(outsider), a_side["ids"]) == before


def test_no_filter_or_list_reaches_another_workspace(api_as, owner, outsider, a_side):
    client = api_as(owner)
    values = [str(a_side["workspace"].pk), *a_side["ids"].values(), a_side["marker"], f"note:eq:{a_side['marker']}",
              "vip"]
    problems = []
    for op in operations(method="get"):
        if op.is_detail:
            continue
        for name in op.query_parameters():
            for value in values:
                response = client.get(op.path, {name: value})
                if response.status_code not in {200, *REFUSED} or leaks(response, a_side, value):
                    problems.append(f"{op} ?{name}={value}: {response.status_code} {leaks(response, a_side, value)}")
            if name == "workspace":
                response = client.get(op.path, {name: a_side["workspace"].pk})
                if response.status_code != 400:
                    problems.append(f"{op} ?workspace=<theirs>: {response.status_code}, not 400")
        for fmt in ("json", "api"):
            response = client.get(op.path, {"format": fmt})
            if leaks(response, a_side):
                problems.append(f"{op} as {fmt}: {leaks(response, a_side)}")
    assert problems == []


def test_no_write_lands_in_or_reads_from_another_workspace(api_as, owner, outsider, workspace, a_side):
    before = snapshot(api_as(outsider), a_side["ids"])
    client = api_as(owner)
    problems = []
    for op in operations():
        if op.is_detail or op.method not in ("post", "put", "patch"):
            continue
        into_theirs = _body_values(op, a_side, a_side["workspace"].pk)
        response = getattr(client, op.method)(op.path, into_theirs, format="json")
        if ("workspace" in into_theirs and response.status_code not in REFUSED) or leaks(response, a_side):
            problems.append(f"{op} into their workspace: {response.status_code} {leaks(response, a_side)}")
        from_theirs = _body_values(op, a_side, workspace.pk)
        response = getattr(client, op.method)(op.path, from_theirs, format="json")
        if response.status_code >= 500 or leaks(response, a_side):
            problems.append(f"{op} naming their objects: {response.status_code} {leaks(response, a_side)}")
    assert problems == []
    assert snapshot(api_as(outsider), a_side["ids"]) == before
