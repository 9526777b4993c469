"""Bad input never gets a 500: each case below answered one before. Every operation of the schema is
tried, as a member of the workspace that owns the objects, and each answer must be a 4xx in the one
error shape. Each test walks every operation and lists all the ones that misbehave."""

import base64
import json

import pytest

from tests.api.schema import assert_error_shape, operations, request_properties

pytestmark = pytest.mark.django_db

NUL = "\u0000"


def _url(op, ids):
    return op.url(ids[op.collection]) if op.is_detail else op.path


def _send(client, op, url, body: str):
    return getattr(client, op.method)(url, data=body, content_type="application/json")


def _problem(op, case, response):
    """None when the response is a 4xx in the error shape, else a line describing what came back."""
    try:
        error = assert_error_shape(response)
    except (AssertionError, ValueError) as exc:
        return f"{op} {case!r}: {response.status_code} {exc}"
    if not 400 <= response.status_code < 500:
        return f"{op} {case!r}: {response.status_code} {error}"
    return None


@pytest.fixture
def owner_client(api_as, owner, world):
    return api_as(owner)


@pytest.fixture
def ids(object_ids, owner):
    return object_ids(owner)


def test_a_deeply_nested_body_is_a_400(owner_client, ids):
    bodies = ["[" * 2000 + "]" * 2000, '{"input": ' + "[" * 2000 + "]" * 2000 + "}", '{"a":' * 300 + "1" + "}" * 300]
    problems = []
    for op in operations():
        if op.has_body:
            for body in bodies:
                response = _send(owner_client, op, _url(op, ids), body)
                problem = _problem(op, body[:12], response)
                message = response.json()["error"]["message"] if problem is None else ""
                if problem is None and (response.status_code != 400 or "deep" not in message):
                    problem = f"{op}: {response.status_code} {response.json()}"
                problems.append(problem)
    assert [p for p in problems if p] == []


def test_a_nul_character_anywhere_in_a_body_is_a_400_naming_the_field(owner_client, ids):
    problems = []
    for op in operations():
        if not op.has_body:
            continue
        url = _url(op, ids)
        for name in list(request_properties(op)) or ["name"]:
            for value in (f"a{NUL}b", {f"k{NUL}": "v"}, {"k": f"v{NUL}"}, [f"{NUL}"]):
                response = _send(owner_client, op, url, json.dumps({name: value}))
                problem = _problem(op, (name, value), response)
                if problem is None and response.status_code == 400 and name not in response.json()["error"].get(
                        "fields", {}):
                    problem = f"{op} {name}={value!r}: 400 not naming {name}: {response.json()}"
                problems.append(problem)
        response = _send(owner_client, op, url, json.dumps({f"x{NUL}": 1}))
        problems.append(_problem(op, "NUL in a key", response))
    assert [p for p in problems if p] == []


def test_the_reported_nul_cases(owner_client, workspace):
    cases = [
        ("/api/durable/schedules/", {"key": "k", "workflow": "tests.sequence", "workspace": workspace.pk,
                                     "every_seconds": 60, "input": {"a": NUL}}, "input"),
        ("/api/durable/events/", {"workspace": workspace.pk, "name": "x", "payload": {NUL: 1}}, "payload"),
        ("/api/memberships/", {"workspace": workspace.pk, "user": f"bob{NUL}"}, "user"),
    ]
    for url, body, field in cases:
        error = assert_error_shape(owner_client.post(url, body, format="json"), status=400)
        assert field in error["fields"], error
    response = owner_client.post("/api/memberships/", f"workspace={workspace.pk}&user=bob%00",
                                 content_type="application/x-www-form-urlencoded")
    assert "user" in assert_error_shape(response, status=400)["fields"]


SURROGATE = "\ud800"  # half a surrogate pair: JSON may spell it ("\\ud800"), UTF-8 and Postgres cannot hold it


def test_a_lone_surrogate_anywhere_in_a_json_body_is_a_400_naming_the_field(owner_client, ids):
    problems = []
    for op in operations():
        if not op.has_body:
            continue
        url = _url(op, ids)
        for name in list(request_properties(op)) or ["name"]:
            for value in ({f"k{SURROGATE}": "v"}, {"k": [f"v{SURROGATE}"]}):
                response = _send(owner_client, op, url, json.dumps({name: value}))
                problem = _problem(op, (name, value), response)
                if problem is None and response.status_code == 400 and name not in response.json()["error"].get(
                        "fields", {}):
                    problem = f"{op} {name}={value!r}: 400 not naming {name}: {response.json()}"
                problems.append(problem)
    assert [p for p in problems if p] == []


def test_the_reported_lone_surrogate_cases(api_as, workspace, owner):
    """Each answered a 500: the item's content hash and the DSL's hash encode the text as UTF-8."""
    from evals.services import golden_set_create
    from tests.builders import graph, node
    from workflows.services import workflow_create

    golden = golden_set_create(workspace=workspace, name="surrogates", graders=[{"kind": "contains"}])
    workflow = workflow_create(workspace=workspace, name="surrogates")
    owner_client = api_as(owner)
    imports = f"/api/golden-sets/{golden.pk}/import/"
    jsonl = (json.dumps({"input": {"text": f"a{SURROGATE}"}}) + "\n").encode()
    error = assert_error_shape(owner_client.post(imports, data=jsonl, content_type="application/jsonl"), status=400)
    assert "file" in error["fields"] and "Surrogate" in error["message"], error
    assert error["errors"] == [{"line": 1, "fields": {"input": ["Surrogate characters are not allowed: U+D800."]}}]
    unknown_key = (json.dumps({"input": "q", f"colour{SURROGATE}": 1}) + "\n").encode()
    error = assert_error_shape(owner_client.post(imports, data=unknown_key, content_type="application/jsonl"),
                               status=400)
    assert list(error["errors"][0]["fields"]) == ["colour"] and "unknown key" in error["message"], error
    cases = [
        (imports, {"items": [{"input": {f"k{SURROGATE}": 1}}]}, "items"),
        ("/api/golden-items/", {"golden_set": golden.pk, "input": {"text": f"q{SURROGATE}"}}, "input"),
        (f"/api/workflows/{workflow.pk}/versions/", {"dsl": graph("a", node("a", prompt=f"Answer{SURROGATE}."))},
         "dsl"),
        ("/api/evolution-runs/", {"workflow": workflow.pk, "golden_set": golden.pk,
                                  "config": {f"population{SURROGATE}": 4}}, "config"),
    ]
    for url, body, field in cases:
        response = owner_client.post(url, data=json.dumps(body), content_type="application/json")  # "\\ud800"
        error = assert_error_shape(response, status=400)
        assert field in error["fields"] and "Surrogate" in error["message"], (url, error)


def test_a_format_suffix_is_never_a_500(owner_client, ids):
    problems = []
    for op in operations(method="get"):
        url = _url(op, ids).rstrip("/") + ".json"
        response = owner_client.get(url)
        if response.status_code >= 500 or (response.status_code >= 400 and _problem(op, url, response)):
            problems.append(f"{url}: {response.status_code}")
    assert problems == []


CURSORS = ["o=1&r=1&p=x", f"p={NUL}", "r=1&p=2024-99-99", "p=99999999999999999999999", "o=1&p=" + "9" * 5000,
           "p=%00", "o=-1&p=1", "r=x"]


def test_a_tampered_cursor_is_a_400_on_the_cursor(owner_client, ids):
    problems = []
    lists = [op for op in operations(method="get") if "cursor" in op.query_parameters()]
    assert len(lists) >= 7
    for op in lists:
        for raw in CURSORS:
            response = owner_client.get(_url(op, ids), {"cursor": base64.b64encode(raw.encode()).decode()})
            problem = _problem(op, raw, response)
            if problem is None:
                error = response.json()["error"]
                if response.status_code != 400 or list(error["fields"]) != ["cursor"] or \
                        not error["message"].startswith("cursor: "):
                    problem = f"{op} {raw!r}: {response.status_code} {error}"
            problems.append(problem)
    assert [p for p in problems if p] == []


def test_a_bad_page_size_is_a_400_on_page_size(owner_client, ids):
    problems = []
    for op in operations(method="get"):
        if "page_size" not in op.query_parameters():
            continue
        for value in ("\u00b2", "\u0663", "9" * 5000, "0", "-1", "1.5", NUL, ""):
            response = owner_client.get(_url(op, ids), {"page_size": value})
            if value == "" and response.status_code == 200:
                continue  # an empty value means the default
            problem = _problem(op, value, response)
            if problem is None and list(response.json()["error"].get("fields", {})) != ["page_size"]:
                problem = f"{op} {value!r}: {response.json()}"
            problems.append(problem)
    assert [p for p in problems if p] == []


def test_a_nul_in_any_query_parameter_is_a_400_naming_it(owner_client, ids):
    problems = []
    for op in operations():
        url = _url(op, ids)
        for name in op.query_parameters() or ["q"]:
            response = getattr(owner_client, op.method)(f"{url}?{name}=a%00b", format="json")
            problem = _problem(op, name, response)
            if problem is None and (response.status_code != 400 or name not in response.json()["error"].get(
                    "fields", {})):
                problem = f"{op} ?{name}: {response.status_code} {response.json()}"
            problems.append(problem)
    assert [p for p in problems if p] == []


def test_a_nul_in_a_path_id_is_a_404(owner_client):
    problems = []
    for op in operations():
        if op.is_detail:
            response = getattr(owner_client, op.method)(op.url("a%00b"), format="json")
            problem = _problem(op, "a%00b", response)
            problems.append(problem or (f"{op}: {response.status_code}" if response.status_code != 404 else None))
    assert [p for p in problems if p] == []


def test_the_reported_filter_cases(owner_client, ids):
    for url in ("/api/durable/runs/", "/api/durable/runs/facets/"):
        for name in ("tag", "attr"):
            error = assert_error_shape(owner_client.get(url, {name: f"x{NUL}"}), status=400)
            assert name in error["fields"]
    for url in ("/api/durable/runs/bulk-retry/", "/api/durable/runs/bulk-cancel/"):
        error = assert_error_shape(owner_client.post(f"{url}?tag=x%00"), status=400)
        assert "tag" in error["fields"]
    run_id = ids["/api/durable/runs/"]
    assert_error_shape(owner_client.get(f"/api/durable/runs/{run_id}%00/"), status=404)


def test_a_bad_cursor_names_the_cursor(owner_client):
    cursor = base64.b64encode(b"r=1&p=2024-99-99").decode()
    error = assert_error_shape(owner_client.get("/api/durable/runs/", {"cursor": cursor}), status=400)
    assert error["message"] == "cursor: Invalid cursor: use the `next` or `previous` link as given."


@pytest.mark.parametrize("url", ["/api/nope/", "/api/durable/nothing/", "/api/knowledge/sources/1/nothing/",
                                 "/api/durable/runs/x/timeline.json"])
def test_an_unrouted_api_url_answers_a_json_404(api_as, owner, url):
    client = api_as(owner)
    assert_error_shape(client.get(url), status=404)
    assert_error_shape(client.post(url, {}, format="json"), status=404)
    assert_error_shape(client.get(url, HTTP_ACCEPT="text/html"), status=404)


def test_a_percent_sign_in_an_attribute_filter_is_quoted_back_not_a_500(owner_client):
    for url in ("/api/durable/runs/", "/api/durable/runs/facets/"):
        error = assert_error_shape(owner_client.get(url, {"attr": "3G%^x"}), status=400)
        assert "'3G%^x' is not key:op:value" in error["message"], error


def test_a_form_with_too_many_fields_is_a_400_in_the_error_shape(owner_client, ids, settings):
    body = "&".join(f"f{index}=1" for index in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    problems = []
    for op in operations():
        if op.has_body:
            response = getattr(owner_client, op.method)(_url(op, ids), data=body,
                                                        content_type="application/x-www-form-urlencoded")
            problem = _problem(op, "too many fields", response)
            if problem is None and response.status_code != 400:
                problem = f"{op}: {response.status_code} {response.json()}"
            problems.append(problem)
    assert [p for p in problems if p] == []
