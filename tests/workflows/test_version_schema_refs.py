"""Review of 5642269: a version's inputSchema checked as it is written (371c8fd), against schemas that pass that
check yet cannot check an input: a `$ref` that names nothing, here or at another address (never fetched)."""

import http.server
import threading

import pytest

from tests.builders import graph, node
from workflows.services import workflow_create

pytestmark = pytest.mark.django_db

WORKFLOWS = "/api/workflows/"
VERSIONS = "/api/workflow-versions/"


@pytest.fixture
def schema_server():
    """A loopback HTTP server that serves a schema and counts the requests it is sent."""
    requests = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requests.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/schema+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def _write(client, workspace, schema):
    workflow = workflow_create(workspace=workspace, name="flow")
    dsl = {**graph("a", node("a")), "inputSchema": schema}
    return client.post(f"{WORKFLOWS}{workflow.pk}/versions/", {"dsl": dsl}, format="json")


def _invoke(client, workspace, schema):
    """The answers to writing a version with `schema` as its inputSchema and, when written, to invoking it."""
    client.raise_request_exception = False
    written = _write(client, workspace, schema)
    if written.status_code != 201:
        return written, None
    return written, client.post(f"{VERSIONS}{written.json()['id']}/invoke/", {"input": {"text": "hello"}},
                                format="json")


def test_a_ref_to_another_address_is_refused_when_written_and_never_fetched(api_as, owner, workspace, schema_server):
    # jsonschema's default registry retrieves a remote reference itself: before, the web process sent a GET to any
    # address a workspace member wrote into a schema, on each invocation
    address, requests = schema_server
    written, invoked = _invoke(api_as(owner), workspace,
                               {"type": "object", "properties": {"text": {"$ref": f"{address}/text.json"}}})
    assert written.status_code == 400 and invoked is None, written.content[:300]
    assert "inputSchema" in written.json()["error"]["fields"]["dsl"], written.json()
    assert requests == [], "the schema's $ref was fetched"


def test_a_dynamic_ref_to_another_address_is_never_fetched_as_an_input_is_checked(api_as, owner, workspace,
                                                                                 schema_server):
    # the write check resolves `$ref`s only: a `$dynamicRef` is resolved as an input is checked, by a validator
    # whose registry fetches nothing, so the input is refused as not checked
    address, requests = schema_server
    written, invoked = _invoke(api_as(owner), workspace,
                               {"type": "object", "properties": {"text": {"$dynamicRef": f"{address}/text.json"}}})
    assert written.status_code == 201, written.content[:300]
    assert invoked.status_code == 400, (invoked.status_code, invoked.content[:300])
    assert invoked.json()["error"]["fields"]["input"][0].startswith("Not checked: a reference of the schema names "
                                                                    "nothing"), invoked.json()
    assert requests == [], "the schema's $dynamicRef was fetched"


def test_a_ref_that_names_nothing_is_refused_when_written_not_a_500_at_each_invocation(api_as, owner, workspace):
    # before, the write check accepted {"$ref": "#/$defs/missing"}; the validator then raised referencing's
    # Unresolvable, which services.input_check did not catch: every invocation was a 500
    written, invoked = _invoke(api_as(owner), workspace,
                               {"type": "object", "properties": {"text": {"$ref": "#/$defs/missing"}}})
    assert written.status_code == 400 and invoked is None, written.content[:300]
    assert "inputSchema" in written.json()["error"]["fields"]["dsl"], written.json()
