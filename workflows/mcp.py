"""A synchronous client for MCP servers reached over streamable HTTP (the official `mcp` SDK).

    manifest = mcp_discover("https://tools.example/mcp", headers={"Authorization": "Bearer ..."})
    result = mcp_call("https://tools.example/mcp", "lookup", {"term": "pgvector"}, headers=...)

Each call opens one session (protocol negotiation, then the request) and closes it: a durable step
or a Celery task calls it from a plain thread, and it runs its own event loop (in a helper thread
when the calling thread already has one running, as under Playwright's sync API).

Only public addresses are reached, by the rule knowledge URLs follow (`knowledge.fetching.AddressPolicy`):
the URL's host is checked before anything is sent (`mcp_check_url`), and again by the socket layer for
every connection the session opens, which connects to the very address it checked, so a DNS answer
that changes between the check and the connection (rebinding) cannot reach the inside network.
Operators open private networks for MCP servers with the ``MCP_ALLOWED_NETWORKS`` setting (a list of
CIDRs, default empty), kept apart from ``KNOWLEDGE_URL_ALLOWED_NETWORKS``: an internal MCP gateway an
operator trusts is no reason to let anyone's knowledge source fetch pages from that network.

Every failure is an `McpError` whose message names the server by scheme, host and path only (never a
query string, which may carry a key) and never repeats a header value sent to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import httpcore2
import httpx2
from django.conf import settings
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    AudioContent,
    EmbeddedResource,
    ImageContent,
    Implementation,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from pydantic import ValidationError

from knowledge.fetching import AddressPolicy, FetchError, Resolver, system_resolver

T = TypeVar("T")

CLIENT_INFO = Implementation(name="lineage", version="0.1")
MAX_TOOL_PAGES = 100  # a server paging tools/list past this is broken or hostile
MAX_ERROR_TEXT = 300  # characters of a server's own error message kept in ours


class McpError(Exception):
    """An MCP server could not be reached or did not do what was asked; the message is meant for
    the user. `transient` errors (timeouts, refused connections, 5xx and 429 answers) are worth retrying."""

    def __init__(self, message: str, *, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class McpToolSpec:
    name: str
    description: str
    input_schema: dict
    output_schema: dict | None


@dataclass(frozen=True)
class Manifest:
    """What a server says about itself when a session opens, and the tools it lists."""

    server_name: str
    server_version: str
    protocol_version: str
    capabilities: dict
    instructions: str
    tools: list[McpToolSpec]


@dataclass(frozen=True)
class ToolResult:
    text: str  # the text content blocks joined by newlines; other blocks as a one-line description
    structured: Any  # the result's structuredContent, or None
    is_error: bool  # the tool ran and reported a failure (a model should read `text`)


# ---- the address check ----

def mcp_address_policy() -> AddressPolicy:
    """The public-address policy widened by the ``MCP_ALLOWED_NETWORKS`` setting."""
    return AddressPolicy(allowed_networks=tuple(settings.MCP_ALLOWED_NETWORKS))


def mcp_check_url(url: str, *, policy: AddressPolicy | None = None,
                  resolver: Resolver | None = None) -> list[str]:
    """The addresses `url`'s host resolves to, all allowed by `policy`; raises McpError otherwise.
    Resolves the name (or reads a literal address) and connects nowhere."""
    host, port = _parse_url(url)
    return _checked_addresses(host, port, policy or mcp_address_policy(), resolver or system_resolver)


def _parse_url(url: str) -> tuple[str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise McpError(f"{_label(url)} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise McpError(f"an MCP server is reached over http or https, not {parts.scheme or 'a relative URL'!r}")
    if not parts.hostname:
        raise McpError(f"{_label(url)} has no host name")
    if parts.username or parts.password:
        raise McpError("an MCP server URL cannot carry credentials: configure them as secret headers instead")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _checked_addresses(host: str, port: int, policy: AddressPolicy, resolver: Resolver) -> list[str]:
    try:
        addresses = [str(ipaddress.ip_address(host))]
        literal = True
    except ValueError:
        literal = False
        try:
            addresses = list(dict.fromkeys(resolver(host, port)))
        except FetchError as exc:
            raise McpError(str(exc), transient=exc.transient) from None
    if not addresses:
        raise McpError(f"{host} does not resolve to any address", transient=True)
    # Every address must pass: a name that also resolves inside the network is a rebinding attempt.
    refused = [address for address in addresses if not policy.allows(address)]
    if refused:
        where = f"{host} is" if literal else f"{host} resolves to {refused[0]}, which is"
        raise McpError(f"{where} not a public address: MCP servers are reached only at public addresses "
                       "(an operator can open a network with MCP_ALLOWED_NETWORKS)")
    return addresses


def _label(url: str) -> str:
    """The URL without its query, fragment and credentials: safe to show."""
    try:
        parts = urlsplit(url)
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        return f"{parts.scheme}://{netloc}{parts.path}" if parts.scheme else "the URL"
    except ValueError:
        return "the URL"


# ---- the HTTP layer: every connection is checked and pinned ----

@dataclass
class _Watch:
    """What the HTTP layer saw, for an error message the SDK's own exceptions do not carry."""

    refused: McpError | None = None
    status: int | None = None  # the last HTTP error status answered


@dataclass
class _CheckedBackend(httpcore2.AsyncNetworkBackend):
    """Opens a TCP connection only to an address the policy allows, resolving the name itself and
    connecting to the checked address (TLS still verifies the name)."""

    policy: AddressPolicy
    resolver: Resolver
    watch: _Watch
    inner: httpcore2.AsyncNetworkBackend = field(default_factory=httpcore2.AnyIOBackend)

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await anyio.to_thread.run_sync(
                _checked_addresses, host, port, self.policy, self.resolver)
        except McpError as exc:
            self.watch.refused = exc
            raise httpcore2.ConnectError(str(exc)) from None
        error: Exception | None = None
        for address in addresses:
            try:
                return await self.inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                error = exc
        raise error

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore2.AsyncNetworkStream:
        raise httpcore2.ConnectError("MCP servers are not reached over unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class _CheckedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, backend: _CheckedBackend):
        super().__init__(trust_env=False)
        # httpx2's transport takes no network backend, so its pool is swapped for the same pool built on
        # ours; requests and errors are still mapped by httpx2. The assertion fails loudly (in the tests)
        # if a release renames the attribute instead of letting connections bypass the check.
        assert isinstance(self._pool, httpcore2.AsyncConnectionPool)
        self._pool = httpcore2.AsyncConnectionPool(
            ssl_context=httpx2.create_ssl_context(trust_env=False), network_backend=backend)


def _http_client(headers: Mapping[str, str], timeout: float, policy: AddressPolicy,
                 resolver: Resolver, watch: _Watch) -> httpx2.AsyncClient:
    async def note_status(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            watch.status = response.status_code

    backend = _CheckedBackend(policy=policy, resolver=resolver, watch=watch)
    return httpx2.AsyncClient(
        headers=dict(headers), timeout=httpx2.Timeout(timeout), transport=_CheckedTransport(backend),
        trust_env=False, event_hooks={"response": [note_status]},
    )


# ---- sessions ----

def _run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine function to completion on a fresh event loop, from any thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp") as pool:
        return pool.submit(anyio.run, fn).result()


def _session(url: str, headers: Mapping[str, str] | None, timeout: float, policy: AddressPolicy | None,
             resolver: Resolver | None, work: Callable[[Client], Awaitable[T]]) -> T:
    headers = {str(k): str(v) for k, v in (headers or {}).items()}
    policy = policy or mcp_address_policy()
    resolver = resolver or system_resolver
    mcp_check_url(url, policy=policy, resolver=resolver)  # refuses before anything is sent
    watch = _Watch()

    async def go() -> T:
        with anyio.fail_after(timeout):
            async with _http_client(headers, timeout, policy, resolver, watch) as http:
                transport = streamable_http_client(url, http_client=http)
                async with Client(transport, read_timeout_seconds=timeout, client_info=CLIENT_INFO,
                                  cache=None) as client:
                    return await work(client)

    try:
        return _run(go)
    except McpError as exc:
        raise McpError(_redact(str(exc), headers), transient=exc.transient) from None
    except Exception as exc:
        error = _translate(exc, url, timeout, watch)
        raise McpError(_redact(str(error), headers), transient=error.transient) from None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _translate(exc: Exception, url: str, timeout: float, watch: _Watch) -> McpError:
    """One clear McpError for what went wrong, whatever the SDK's task groups wrapped it in."""
    label = _label(url)
    if watch.refused is not None:
        return watch.refused
    leaves = _leaves(exc)
    for leaf in leaves:
        if isinstance(leaf, McpError):
            return leaf
    if any(isinstance(leaf, TimeoutError | httpx2.TimeoutException) for leaf in leaves):
        return McpError(f"{label} did not answer within {timeout:g} s", transient=True)
    if any(isinstance(leaf, httpx2.ConnectError) for leaf in leaves):
        return McpError(f"{label} could not be reached (connection failed)", transient=True)
    if watch.status is not None:
        status = watch.status
        hint = ""
        if status in (401, 403):
            hint = ": check the credentials configured for this server"
        elif status == 404:
            hint = ": is this the server's MCP endpoint?"
        return McpError(f"{label} answered HTTP {status}{hint}", transient=status >= 500 or status == 429)
    for leaf in leaves:
        if isinstance(leaf, httpx2.HTTPError):
            return McpError(f"{label} broke off the exchange: {type(leaf).__name__}", transient=True)
        if isinstance(leaf, MCPError):
            return McpError(f"{label} answered with an MCP error {leaf.code}: {_clip(leaf.message)}")
        if isinstance(leaf, ValidationError):
            return McpError(f"{label} answered with a message that is not valid MCP ({leaf.error_count()} errors)")
        if isinstance(leaf, RuntimeError):
            return McpError(f"{label}: {_clip(str(leaf))}")
    first = leaves[0]
    return McpError(f"{label} failed: {type(first).__name__}: {_clip(str(first))}")


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "..."


def _redact(message: str, headers: Mapping[str, str]) -> str:
    """A server may echo what it was sent; no header value ever reaches a message."""
    for value in sorted({v for v in headers.values() if len(v) >= 4}, key=len, reverse=True):
        message = message.replace(value, "[redacted]")
        token = value.split(" ", 1)[-1]  # "Bearer xyz": the token alone is also secret
        if len(token) >= 4:
            message = message.replace(token, "[redacted]")
    return message


async def _all_tools(client: Client, label: str) -> list:
    tools, cursor, seen = [], None, set()
    for _page in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
        if cursor in seen:
            raise McpError(f"{label} repeats the tools/list cursor {cursor[:40]!r}")
        seen.add(cursor)
    raise McpError(f"{label} lists tools over more than {MAX_TOOL_PAGES} pages")


# ---- the public calls ----

def mcp_discover(url: str, *, headers: Mapping[str, str] | None = None, timeout: float = 30,
                 policy: AddressPolicy | None = None, resolver: Resolver | None = None) -> Manifest:
    """Open a session with the server at `url` and read its name, version, protocol version,
    capabilities and every tool it lists (all pages). Raises McpError."""
    label = _label(url)

    async def work(client: Client) -> Manifest:
        tools = await _all_tools(client, label)
        info = client.server_info
        return Manifest(
            server_name=info.name if info else "",
            server_version=info.version if info else "",
            protocol_version=client.protocol_version or "",
            capabilities=client.server_capabilities.model_dump(mode="json", by_alias=True, exclude_none=True),
            instructions=client.instructions or "",
            tools=[McpToolSpec(name=t.name, description=t.description or "", input_schema=t.input_schema or {},
                               output_schema=t.output_schema) for t in tools],
        )

    return _session(url, headers, timeout, policy, resolver, work)


def mcp_call(url: str, tool: str, arguments: dict, *, headers: Mapping[str, str] | None = None,
             timeout: float = 60, policy: AddressPolicy | None = None,
             resolver: Resolver | None = None) -> ToolResult:
    """Call one tool of the server at `url`. A tool that runs and fails is a result with
    `is_error`; a tool the server does not list, or a failure to talk to it, raises McpError."""
    label = _label(url)

    async def work(client: Client) -> ToolResult:
        # Listing first costs no extra round trip on success (the SDK lists the tools anyway to check
        # the result against the tool's output schema) and tells a missing tool apart from a failing one.
        names = {t.name for t in await _all_tools(client, label)}
        if tool not in names:
            raise McpError(f"{label} has no tool named {tool!r} (it lists {len(names)} tools)")
        result = await client.call_tool(tool, arguments)
        return ToolResult(text=_text_of(result.content), structured=result.structured_content,
                          is_error=bool(result.is_error))

    return _session(url, headers, timeout, policy, resolver, work)


def _text_of(content: list) -> str:
    parts = []
    for block in content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, ImageContent | AudioContent):
            kind = "image" if isinstance(block, ImageContent) else "audio"
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4:,} bytes]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource {block.uri}" + (f" ({block.name})" if block.name else "") + "]")
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            if isinstance(resource, TextResourceContents):
                parts.append(resource.text)
            else:
                parts.append(f"[embedded resource {resource.uri} ({resource.mime_type or 'binary'})]")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    return "\n".join(parts)

