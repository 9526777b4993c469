"""The MCP registry: syncing a server's manifest into versions and tools, the headers a user's calls
carry, calling a registered tool, and the tool names a workflow node may use."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from django.db import transaction
from django.db.models import Prefetch

from durable import release_connection
from workflows.mcp import Manifest, McpError, ToolResult, mcp_call, mcp_discover
from workflows.mcp_models import McpServer, McpServerVersion, McpTool, UserServerConfig
from workspaces.models import Workspace

_VERSION_MAX = McpServerVersion._meta.get_field("version").max_length
_SPEC_MAX = McpServerVersion._meta.get_field("spec_version").max_length
_TOOL_NAME_MAX = McpTool._meta.get_field("name").max_length


def mcp_manifest_hash(manifest: Manifest) -> str:
    """SHA-256 of the canonical JSON of what a version is: the server's reported version and its
    tools (sorted by name; keys sorted). Capabilities and instructions are not part of it."""
    tools = sorted(({"name": t.name, "description": t.description, "input_schema": t.input_schema,
                     "output_schema": t.output_schema} for t in manifest.tools), key=lambda t: t["name"])
    canonical = json.dumps({"version": manifest.server_version, "tools": tools}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def mcp_server_register(*, workspace: Workspace, slug: str, url: str, display_name: str = "",
                        description: str = "") -> McpServer:
    """Create the workspace's server `slug`, or point an existing one at `url`."""
    server, _created = McpServer.objects.update_or_create(
        workspace=workspace, slug=slug,
        defaults={"url": url, "display_name": display_name or slug, "description": description},
    )
    return server


def mcp_server_sync(*, server: McpServer, headers: Mapping[str, str] | None = None,
                    timeout: float = 30) -> tuple[McpServerVersion, bool]:
    """Discover the server's manifest and make it the active version. Returns (version, changed):
    the same manifest as the active version keeps it, (active, False); a new manifest becomes a new
    version with its tools, the previous one superseded, (new, True); a manifest seen before (the
    server went back) reactivates that version, (old, True). The server's row is locked while the
    versions change, so concurrent syncs settle on one active version. Raises McpError."""
    manifest = mcp_discover(server.url, headers=headers, timeout=timeout)  # no lock held while the network works
    names = [tool.name for tool in manifest.tools]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise McpError(f"{server.slug} lists the tool {duplicates[0]!r} more than once")
    too_long = [name for name in names if len(name) > _TOOL_NAME_MAX]
    if too_long:
        raise McpError(f"{server.slug} has a tool name longer than {_TOOL_NAME_MAX} characters: "
                       f"{too_long[0][:40]!r}...")
    digest = mcp_manifest_hash(manifest)
    with transaction.atomic():
        McpServer.objects.select_for_update().filter(pk=server.pk).values_list("pk", flat=True).get()
        known = McpServerVersion.objects.filter(server=server, manifest_hash=digest).first()
        if known is not None and known.status == McpServerVersion.Status.ACTIVE:
            return known, False
        McpServerVersion.objects.filter(server=server, status=McpServerVersion.Status.ACTIVE).update(
            status=McpServerVersion.Status.SUPERSEDED)
        if known is not None:
            known.status = McpServerVersion.Status.ACTIVE
            known.save(update_fields=["status"])
            return known, True
        version = McpServerVersion.objects.create(
            server=server, version=manifest.server_version[:_VERSION_MAX],
            spec_version=manifest.protocol_version[:_SPEC_MAX], capabilities=manifest.capabilities,
            manifest_hash=digest, status=McpServerVersion.Status.ACTIVE,
        )
        McpTool.objects.bulk_create([
            McpTool(server_version=version, name=tool.name, description=tool.description,
                    input_schema=tool.input_schema, output_schema=tool.output_schema)
            for tool in manifest.tools
        ])
    return version, True


def mcp_headers_for(*, user, server: McpServer) -> dict[str, str]:
    """The headers `user`'s calls to `server` carry: their config's plain `headers`, overridden by
    their decrypted secret headers (names compared without case). No config: no headers; a
    disabled config refuses the call. Raises McpError without quoting any secret."""
    if user is None:
        return {}
    try:
        config = UserServerConfig.objects.filter(user=user, server=server).first()
    except ValueError:  # the encrypted column does not decrypt with the configured keys
        raise McpError(f"the secrets saved for MCP server {server.slug} cannot be decrypted with the "
                       "configured FIELD_ENCRYPTION_KEYS: save them again") from None
    if config is None:
        return {}
    if not config.enabled:
        raise McpError(f"MCP server {server.slug} is disabled for this user")
    plain = (config.config or {}).get("headers") or {}
    if not isinstance(plain, dict) or not all(isinstance(v, str) for v in plain.values()):
        raise McpError(f"the headers configured for MCP server {server.slug} must be an object of strings")
    secret = {}
    if config.secrets:
        try:
            secret = json.loads(config.secrets)
        except ValueError:
            secret = None
        if not isinstance(secret, dict) or not all(isinstance(v, str) for v in secret.values()):
            raise McpError(f"the secrets saved for MCP server {server.slug} must be a JSON object of header "
                           "names to strings")
    overridden = {name.lower() for name in secret}
    headers = {str(k): v for k, v in plain.items() if str(k).lower() not in overridden}
    headers.update(secret)
    return headers


def mcp_tool_call(*, server: McpServer, tool: str, arguments: dict, user=None, timeout: float = 60) -> ToolResult:
    """Call `tool` of `server` with `user`'s headers. The tool must be in the server's active
    version (synced); a tool that fails is a result with `is_error`. Raises McpError."""
    active = McpServerVersion.objects.filter(server=server, status=McpServerVersion.Status.ACTIVE).first()
    if active is None:
        raise McpError(f"MCP server {server.slug} has not been synced yet (manage.py mcp_sync {server.slug})")
    if not McpTool.objects.filter(server_version=active, name=tool).exists():
        raise McpError(f"MCP server {server.slug} has no tool {tool!r} in its active version "
                       f"(manage.py mcp_sync {server.slug} refreshes it)")
    headers = mcp_headers_for(user=user, server=server)
    release_connection()  # in a queued step: no database connection held while the server answers
    return mcp_call(server.url, tool, arguments, headers=headers, timeout=timeout)


def mcp_available_tools(*, workspace: Workspace | int) -> dict[str, list[McpTool]]:
    """The names a node may list in `mcpTools`, each with the tools it stands for: a server's slug
    (all the tools of its active version, by name) and `slug/tool`. Servers never synced offer
    nothing. Two queries; each tool's `server_version.server` is loaded with it."""
    versions = (
        McpServerVersion.objects
        .filter(server__workspace=workspace, status=McpServerVersion.Status.ACTIVE)
        .select_related("server")
        .prefetch_related(Prefetch("tools", queryset=McpTool.objects.order_by("name")))
    )
    available: dict[str, list[McpTool]] = {}
    for version in versions:
        tools = list(version.tools.all())
        for tool in tools:
            tool.server_version = version  # the prefetch's instance, with its server already joined
            available[f"{version.server.slug}/{tool.name}"] = [tool]
        available[version.server.slug] = tools
    return available
