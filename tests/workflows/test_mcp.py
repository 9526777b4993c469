"""The MCP registry against a real MCP server (the SDK's MCPServer over streamable HTTP, served by
uvicorn on 127.0.0.1): discovery, syncing versions, calls, users' secret headers, and the address
check, which is tested with injected resolvers and never connects anywhere but loopback."""

import asyncio
import json
import logging
import socket
import threading
import time
from io import StringIO

import anyio
import pytest
import uvicorn
from django.core.management import CommandError, call_command
from django.db import connection
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ListToolsResult

from knowledge.fetching import AddressPolicy
from tests.factories import UserFactory, WorkspaceFactory
from workflows.mcp import McpError, mcp_call, mcp_check_url, mcp_discover
from workflows.mcp_services import (
    mcp_available_tools,
    mcp_headers_for,
    mcp_server_register,
    mcp_server_sync,
    mcp_tool_call,
)
from workflows.models import McpServer, McpServerVersion, McpTool, UserServerConfig

TOKEN = "Bearer tok-5f3a9c2e-never-in-plaintext"
LOOPBACK = ["127.0.0.1/32"]


# ---- the test server ----

class PagedServer(MCPServer):
    """Lists its tools two per page, so a client has to follow cursors."""

    async def _handle_list_tools(self, ctx, params):
        tools = await self.list_tools()
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + 2
        return ListToolsResult(tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None)


class Recorder:
    """An ASGI wrapper that records each request's headers and guards /private/... with a token."""

    def __init__(self, app):
        self.app = app
        self.requests: list[dict[str, str]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            self.requests.append(headers)
            if scope["path"].startswith("/private/"):
                if headers.get("authorization") != TOKEN:
                    await send({"type": "http.response.start", "status": 401,
                                "headers": [(b"content-type", b"text/plain")]})
                    await send({"type": "http.response.body", "body": b"unauthorized"})
                    return
                scope = {**scope, "path": scope["path"][len("/private"):], "raw_path": None}
        await self.app(scope, receive, send)


def build_server() -> MCPServer:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    server = PagedServer("test-tools", version="1.0.0", log_level="ERROR")
    root.handlers[:], root.level = handlers, level  # MCPServer configures the root logger; not in our tests

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def lookup(term: str) -> str:
        """Look a term up in the glossary."""
        return {"pgvector": "vector similarity search for Postgres"}.get(term, f"no entry for {term}")

    @server.tool()
    def explode() -> str:
        """Always fails."""
        raise ValueError("the tool broke")

    @server.tool()
    def whoami(ctx: Context) -> str:
        """Says whether the caller sent the expected Authorization header."""
        return "authorized" if (ctx.headers or {}).get("authorization") == TOKEN else "anonymous"

    @server.tool()
    async def slow() -> str:
        """Takes its time."""
        await anyio.sleep(3)
        return "done"

    return server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    def __init__(self):
        self.mcp = build_server()
        # the test names tools.test reach it too (resolved by an injected resolver)
        security = TransportSecuritySettings(allowed_hosts=["127.0.0.1:*", "tools.test:*"])
        self.recorder = Recorder(self.mcp.streamable_http_app(transport_security=security))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.private_url = f"http://127.0.0.1:{self.port}/private/mcp"
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.recorder, host="127.0.0.1", port=self.port,
                                                     log_config=None, log_level="error", lifespan="on"))
        self.thread = threading.Thread(target=self.uvicorn.run, name="mcp-test-server", daemon=True)

    def start(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.uvicorn.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the test MCP server did not start"
            time.sleep(0.02)

    def stop(self):
        self.uvicorn.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def live():
    server = LiveServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.MCP_ALLOWED_NETWORKS = LOOPBACK


@pytest.fixture
def registered(db, workspace, live):
    return mcp_server_register(workspace=workspace, slug="tools", url=live.url, display_name="Test tools")


@pytest.fixture
def no_connections(monkeypatch):
    """Fails the test on any attempt to open a connection to an address outside loopback."""
    attempts = []
    real_connect = anyio.connect_tcp
    real_create = socket.create_connection

    async def guarded_connect(remote_host, *args, **kwargs):
        attempts.append(remote_host)
        if not str(remote_host).startswith("127."):
            raise AssertionError(f"connection attempted to {remote_host}")
        return await real_connect(remote_host, *args, **kwargs)

    def guarded_create(address, *args, **kwargs):
        attempts.append(address[0])
        if not str(address[0]).startswith("127."):
            raise AssertionError(f"connection attempted to {address[0]}")
        return real_create(address, *args, **kwargs)

    monkeypatch.setattr(anyio, "connect_tcp", guarded_connect)
    monkeypatch.setattr(socket, "create_connection", guarded_create)
    return attempts


# ---- discovery and calls ----

def test_discovery_reads_the_server_and_every_page_of_tools(live):
    manifest = mcp_discover(live.url)
    assert (manifest.server_name, manifest.server_version) == ("test-tools", "1.0.0")
    assert manifest.protocol_version and "tools" in manifest.capabilities
    tools = {tool.name: tool for tool in manifest.tools}
    assert set(tools) == {"add", "lookup", "explode", "whoami", "slow"}  # three pages of two
    assert tools["add"].description == "Add two integers."
    assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"
    assert tools["add"].input_schema["required"] == ["a", "b"]
    assert tools["add"].output_schema["properties"]["result"]["type"] == "integer"


def test_a_call_returns_text_and_structured_content(live):
    result = mcp_call(live.url, "add", {"a": 2, "b": 40})
    assert (result.text, result.structured, result.is_error) == ("42", {"result": 42}, False)
    assert "vector similarity" in mcp_call(live.url, "lookup", {"term": "pgvector"}).text


def test_a_tool_that_raises_is_an_error_result_not_an_exception(live):
    result = mcp_call(live.url, "explode", {})
    assert result.is_error and "explode" in result.text and result.structured is None


def test_a_tool_the_server_does_not_list_is_a_clear_error(live):
    with pytest.raises(McpError, match="has no tool named 'subtract'"):
        mcp_call(live.url, "subtract", {"a": 1, "b": 2})


def test_a_slow_server_times_out_with_a_clear_error(live):
    # the tool takes 3 s: an answer ("done") would mean the 1 s timeout never fired
    with pytest.raises(McpError, match="did not answer within 1 s") as caught:
        mcp_call(live.url, "slow", {}, timeout=1)
    assert caught.value.transient


def test_calls_work_from_a_worker_thread_and_under_a_running_event_loop(live):
    results = []
    worker = threading.Thread(target=lambda: results.append(mcp_call(live.url, "add", {"a": 1, "b": 1}).text))
    worker.start()
    worker.join(timeout=30)

    async def inside_a_loop():  # as under Playwright's sync API, or an async caller that forgot to_thread
        return mcp_call(live.url, "add", {"a": 2, "b": 2}).text

    results.append(asyncio.run(inside_a_loop()))
    assert results == ["2", "4"]


def test_an_unreachable_server_is_a_clear_transient_error():
    url = f"http://127.0.0.1:{free_port()}/mcp"  # nothing listens there
    with pytest.raises(McpError, match=r"could not be reached") as caught:
        mcp_discover(url, timeout=5)
    assert caught.value.transient


def test_a_wrong_path_names_the_http_status(live):
    with pytest.raises(McpError, match="answered HTTP 404"):
        mcp_discover(live.url.replace("/mcp", "/nothing-here?key=hunter2"))
    with pytest.raises(McpError) as caught:
        mcp_discover(live.url.replace("/mcp", "/nothing-here?key=hunter2"))
    assert "hunter2" not in str(caught.value)  # a query string may hold a key: never shown


def test_refused_credentials_name_the_status_and_never_the_secret(live):
    with pytest.raises(McpError, match="HTTP 401: check the credentials") as caught:
        mcp_discover(live.private_url, headers={"Authorization": "Bearer wrong-token-123"})
    assert "wrong-token-123" not in str(caught.value)
    assert mcp_discover(live.private_url, headers={"Authorization": TOKEN}).server_name == "test-tools"


# ---- the address check ----

@pytest.mark.parametrize("address", ["169.254.169.254", "10.0.0.1", "127.0.0.1", "::1", "::ffff:10.0.0.1"])
def test_the_check_refuses_names_resolving_inside_the_network(settings, address):
    settings.MCP_ALLOWED_NETWORKS = []
    asked = []

    def resolver(host, port):
        asked.append((host, port))
        return [address]

    with pytest.raises(McpError, match=f"tools.example resolves to {address}, which is not a public address"):
        mcp_check_url("https://tools.example/mcp", resolver=resolver)
    assert asked == [("tools.example", 443)]


def test_the_check_refuses_literal_private_and_metadata_addresses_and_accepts_public_ones(settings):
    settings.MCP_ALLOWED_NETWORKS = []
    for url in ("http://169.254.169.254/latest/meta-data", "http://10.0.0.1/mcp", "http://[fd00:ec2::254]/mcp"):
        with pytest.raises(McpError, match="is not a public address"):
            mcp_check_url(url, resolver=lambda host, port: pytest.fail("a literal address is not resolved"))
    with pytest.raises(McpError, match="public address"):  # one bad answer among good ones is enough
        mcp_check_url("https://mixed.example/mcp", resolver=lambda host, port: ["93.184.215.14", "10.1.2.3"])
    assert mcp_check_url("https://tools.example/mcp", resolver=lambda host, port: ["93.184.215.14"]) == [
        "93.184.215.14"]
    # an allowed network opens exactly that network, not the metadata address next to it
    policy = AddressPolicy(allowed_networks=("10.0.0.0/24",))
    assert mcp_check_url("http://10.0.0.1/mcp", policy=policy) == ["10.0.0.1"]
    with pytest.raises(McpError):
        mcp_check_url("http://169.254.169.254/mcp", policy=policy)


def test_the_check_refuses_other_schemes_and_credentials_in_the_url():
    with pytest.raises(McpError, match="http or https"):
        mcp_check_url("file:///etc/passwd")
    with pytest.raises(McpError, match="cannot carry credentials"):
        mcp_check_url("https://user:pass@tools.example/mcp", resolver=lambda host, port: ["93.184.215.14"])


def test_a_refused_server_is_never_connected_to(settings, no_connections):
    settings.MCP_ALLOWED_NETWORKS = []
    for address in ("169.254.169.254", "10.0.0.1"):
        with pytest.raises(McpError, match="not a public address"):
            mcp_discover("http://internal.example/mcp", resolver=lambda host, port, a=address: [a])
        with pytest.raises(McpError, match="not a public address"):
            mcp_call("http://internal.example/mcp", "add", {}, resolver=lambda host, port, a=address: [a])
    assert no_connections == []


def test_a_name_that_changes_its_answer_after_the_check_is_refused_at_connection(live, no_connections):
    answers = iter([["127.0.0.1"], ["10.0.0.1"]])  # the check sees loopback (allowed), the connection the inside
    with pytest.raises(McpError, match=r"rebind\.example resolves to 10\.0\.0\.1"):
        mcp_discover(f"http://rebind.example:{live.port}/mcp", resolver=lambda host, port: next(answers))
    assert no_connections == []


def test_a_name_is_connected_at_the_address_that_was_checked(live, no_connections):
    manifest = mcp_discover(f"http://tools.test:{live.port}/mcp", resolver=lambda host, port: ["127.0.0.1"])
    assert manifest.server_name == "test-tools"
    assert set(no_connections) == {"127.0.0.1"}
    assert live.recorder.requests[-1]["host"] == f"tools.test:{live.port}"  # the name is still sent


# ---- the registry ----

@pytest.mark.django_db
def test_sync_creates_a_version_with_its_tools_then_keeps_it_when_unchanged(registered):
    version, changed = mcp_server_sync(server=registered)
    assert changed and version.status == McpServerVersion.Status.ACTIVE
    assert (version.version, len(version.manifest_hash)) == ("1.0.0", 64)
    assert version.spec_version and "tools" in version.capabilities
    tools = {tool.name: tool for tool in version.tools.all()}
    assert set(tools) == {"add", "lookup", "explode", "whoami", "slow"}
    assert tools["lookup"].description == "Look a term up in the glossary."
    assert tools["lookup"].input_schema["required"] == ["term"]

    again, changed = mcp_server_sync(server=registered)
    assert (again.pk, changed) == (version.pk, False)
    assert McpServerVersion.objects.filter(server=registered).count() == 1


@pytest.mark.django_db
def test_a_changed_tool_list_supersedes_the_active_version_and_going_back_reactivates_it(registered, live):
    first, _ = mcp_server_sync(server=registered)

    @live.mcp.tool()
    def echo(text: str) -> str:
        """Repeat the text."""
        return text

    try:
        second, changed = mcp_server_sync(server=registered)
        assert changed and second.pk != first.pk and second.manifest_hash != first.manifest_hash
        first.refresh_from_db()
        assert first.status == McpServerVersion.Status.SUPERSEDED
        assert second.status == McpServerVersion.Status.ACTIVE
        assert "echo" in set(second.tools.values_list("name", flat=True))
        assert "echo" not in set(first.tools.values_list("name", flat=True))
    finally:
        live.mcp.remove_tool("echo")

    third, changed = mcp_server_sync(server=registered)
    assert changed and third.pk == first.pk
    assert list(McpServerVersion.objects.filter(server=registered, status="active")) == [first]


@pytest.mark.django_db(transaction=True)
def test_concurrent_syncs_of_a_new_manifest_settle_on_one_active_version(registered, monkeypatch):
    import workflows.mcp_services as services
    from tests.durable.concurrency import in_thread

    both_discovered = threading.Barrier(2, timeout=20)
    discover = services.mcp_discover

    def discover_then_race(*args, **kwargs):
        manifest = discover(*args, **kwargs)
        both_discovered.wait()  # both hold the same new manifest before either writes
        return manifest

    def linger_after_the_manifest_lookup(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "manifest_hash" in sql and sql.lstrip().upper().startswith("SELECT"):
            time.sleep(0.3)  # what the other sync reads now must not be "no such version yet"
        return result

    monkeypatch.setattr(services, "mcp_discover", discover_then_race)
    runs = [in_thread(lambda: mcp_server_sync(server=registered), wrapper=linger_after_the_manifest_lookup)
            for _ in range(2)]
    for thread, _ in runs:
        thread.join(timeout=30)
    outcomes = [outcome for _, outcome in runs]
    assert all("value" in outcome for outcome in outcomes), outcomes
    assert sorted(outcome["value"][1] for outcome in outcomes) == [False, True]
    assert {outcome["value"][0].pk for outcome in outcomes} == set(
        McpServerVersion.objects.filter(server=registered).values_list("pk", flat=True))
    assert McpTool.objects.filter(server_version__server=registered).count() == 5


@pytest.mark.django_db
def test_a_registered_tool_is_called_and_an_unknown_one_is_refused_without_calling(registered, live):
    mcp_server_sync(server=registered)
    result = mcp_tool_call(server=registered, tool="add", arguments={"a": 3, "b": 4}, user=None)
    assert (result.text, result.structured, result.is_error) == ("7", {"result": 7}, False)
    assert mcp_tool_call(server=registered, tool="explode", arguments={}, user=None).is_error
    before = len(live.recorder.requests)
    with pytest.raises(McpError, match="no tool 'subtract' in its active version"):
        mcp_tool_call(server=registered, tool="subtract", arguments={}, user=None)
    assert len(live.recorder.requests) == before


@pytest.mark.django_db
def test_an_unsynced_server_cannot_be_called(registered):
    with pytest.raises(McpError, match="has not been synced"):
        mcp_tool_call(server=registered, tool="add", arguments={}, user=None)


@pytest.mark.django_db
def test_a_users_secret_headers_reach_the_server_and_are_encrypted_at_rest(registered, live):
    mcp_server_sync(server=registered)
    user = UserFactory(username="alice")
    config = UserServerConfig.objects.create(user=user, server=registered, config={"headers": {"X-Team": "blue"}},
                                             secrets=json.dumps({"Authorization": TOKEN}))
    with connection.cursor() as cursor:
        cursor.execute("SELECT secrets FROM workflows_userserverconfig WHERE id = %s", [config.pk])
        (raw,) = cursor.fetchone()
    assert raw.startswith("fernet:") and "tok-5f3a9c2e" not in raw and "Authorization" not in raw

    assert mcp_headers_for(user=user, server=registered) == {"X-Team": "blue", "Authorization": TOKEN}
    result = mcp_tool_call(server=registered, tool="whoami", arguments={}, user=user)
    assert result.text == "authorized"
    sent = live.recorder.requests[-1]
    assert sent["authorization"] == TOKEN and sent["x-team"] == "blue"
    # without the user's config, nothing secret is sent
    assert mcp_tool_call(server=registered, tool="whoami", arguments={}, user=None).text == "anonymous"


@pytest.mark.django_db
def test_headers_for_a_user_without_config_disabled_or_broken_config(registered):
    user = UserFactory(username="bob")
    assert mcp_headers_for(user=user, server=registered) == {}
    config = UserServerConfig.objects.create(user=user, server=registered, enabled=False,
                                             secrets=json.dumps({"Authorization": TOKEN}))
    with pytest.raises(McpError, match="disabled for this user"):
        mcp_headers_for(user=user, server=registered)
    config.enabled = True
    config.secrets = "Bearer not-json-secret"
    config.save()
    with pytest.raises(McpError, match="JSON object") as caught:
        mcp_headers_for(user=user, server=registered)
    assert "not-json-secret" not in str(caught.value)
    # a secret overrides a plain header of the same name, whatever its case
    config.secrets = json.dumps({"authorization": TOKEN})
    config.config = {"headers": {"Authorization": "plain", "X-Other": "1"}}
    config.save()
    assert mcp_headers_for(user=user, server=registered) == {"X-Other": "1", "authorization": TOKEN}


@pytest.mark.django_db
def test_available_tools_map_slugs_and_slash_names_in_two_queries(registered, workspace, django_assert_num_queries):
    mcp_server_sync(server=registered)
    other = mcp_server_register(workspace=workspace, slug="never-synced", url="https://tools.example/mcp")
    elsewhere = WorkspaceFactory(slug="elsewhere")
    McpServer.objects.create(workspace=elsewhere, slug="tools", display_name="t", url="https://x.example/mcp")
    with django_assert_num_queries(2):
        available = mcp_available_tools(workspace=workspace)
        servers = {tool.server_version.server.slug for tools in available.values() for tool in tools}
    assert servers == {"tools"}
    assert [tool.name for tool in available["tools"]] == ["add", "explode", "lookup", "slow", "whoami"]
    assert [tool.name for tool in available["tools/lookup"]] == ["lookup"]
    assert other.slug not in available and "never-synced/add" not in available
    assert mcp_available_tools(workspace=workspace.pk).keys() == available.keys()
    assert mcp_available_tools(workspace=elsewhere) == {}


# ---- the command ----

def run(*args) -> str:
    out = StringIO()
    call_command("mcp_sync", *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_command_prints_the_version_and_tools_then_unchanged(registered):
    first = run("tools")
    assert "acme/tools: new version: version 1.0.0" in first and "5 tools" in first
    assert "  add: Add two integers." in first and "  lookup: Look a term up in the glossary." in first
    assert "acme/tools: unchanged" in run("tools", "--workspace", "acme")
    assert McpTool.objects.filter(server_version__server=registered).count() == 5


@pytest.mark.django_db
def test_the_command_registers_a_server_then_syncs_it(workspace, live):
    out = run("--register", "--workspace", "acme", "--slug", "glossary", "--url", live.url, "--name", "Glossary")
    assert "acme/glossary: registered" in out and "acme/glossary: new version" in out
    server = McpServer.objects.get(workspace=workspace, slug="glossary")
    assert server.display_name == "Glossary" and server.url == live.url
    assert McpServerVersion.objects.filter(server=server, status="active").exists()


@pytest.mark.django_db
def test_the_command_reports_errors_clearly(workspace, live):
    with pytest.raises(CommandError, match="No MCP server with the slug 'ghost'"):
        run("ghost")
    mcp_server_register(workspace=workspace, slug="private", url=live.private_url)
    with pytest.raises(CommandError, match=r"acme/private: .*HTTP 401: check the credentials"):
        run("private")
    user = UserFactory(username="carol")
    server = McpServer.objects.get(slug="private")
    UserServerConfig.objects.create(user=user, server=server, secrets=json.dumps({"Authorization": TOKEN}))
    assert "new version" in run("private", "--as-user", "carol")
    McpServer.objects.create(workspace=WorkspaceFactory(slug="globex"), slug="private", display_name="p",
                             url=live.private_url)
    with pytest.raises(CommandError, match=r"several workspaces \(acme, globex\): pass --workspace"):
        run("private")
    mcp_server_register(workspace=workspace, slug="down", url=f"http://127.0.0.1:{free_port()}/mcp")
    with pytest.raises(CommandError, match="could not be reached"):
        run("down", "--timeout", "5")
    with pytest.raises(CommandError, match="--register needs"):
        run("--register", "--workspace", "acme")


def test_a_workflow_node_calls_an_mcp_tool_with_the_invoking_users_secret_headers(registered, live, owner):
    """A node naming `tools/lookup` and `tools/whoami` is offered them as `tools__lookup` and
    `tools__whoami`; the offline model calls the ones its prompt names; the call carries the
    invoking user's secret headers."""
    import json

    from durable.inprocess import run_until_settled
    from workflows.models import Message, UserServerConfig, WorkflowInvocation
    from workflows.services import invocation_start, workflow_create, workflow_version_create

    mcp_server_sync(server=registered)
    UserServerConfig.objects.create(user=owner, server=registered, secrets=json.dumps({"Authorization": TOKEN}))
    workflow = workflow_create(workspace=registered.workspace, name="glossary")
    version, _ = workflow_version_create(workflow=workflow, dsl={"entryNodeId": "a", "nodes": [{
        "nodeId": "a", "modelName": "gpt-4.1-mini", "mcpTools": ["tools/lookup", "tools/whoami"],
        "systemPrompt": "Call tools__whoami before answering. Then use tools__lookup."}]})
    invocation = invocation_start(version=version, input={"text": "pgvector"}, user=owner)
    run_until_settled(invocation.durable_run_id, max_wait=30)
    invocation.refresh_from_db()
    assert invocation.status == WorkflowInvocation.Status.COMPLETED, invocation.error
    tools = list(Message.objects.filter(workflow_invocation=invocation, role="tool").order_by("seq")
                 .values_list("payload", flat=True))
    assert [(t["name"], t["content"], t["error"]) for t in tools] == [
        ("tools__whoami", "authorized", False),
        ("tools__lookup", "vector similarity search for Postgres", False),
    ]
    assert tools[1]["arguments"] == {"term": "pgvector"}
    assert "vector similarity search for Postgres" in invocation.output["text"]


def test_an_invocation_naming_an_unsynced_mcp_server_is_refused(registered):
    from workflows.services import InvocationRefused, invocation_start, workflow_create, workflow_version_create

    workflow = workflow_create(workspace=registered.workspace, name="unsynced")
    version, _ = workflow_version_create(workflow=workflow, dsl={"entryNodeId": "a", "nodes": [{
        "nodeId": "a", "modelName": "gpt-4.1-mini", "mcpTools": ["tools"]}]})
    with pytest.raises(InvocationRefused) as refused:
        invocation_start(version=version, input={})
    assert refused.value.errors["tools"][0].startswith("a.tools ")
    mcp_server_sync(server=registered)
    invocation_start(version=version, input={})  # synced: accepted
