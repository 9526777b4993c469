"""Sync an MCP server's manifest (its version and tools) into the registry."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from workflows.mcp import McpError
from workflows.mcp_services import mcp_headers_for, mcp_server_register, mcp_server_sync
from workflows.models import McpServer
from workspaces.models import Workspace


class Command(BaseCommand):
    help = ("Discover an MCP server's tools and record them as its active version (unchanged when the "
            "manifest is the same). `--register` first creates the server, or points it at a new URL.")

    def add_arguments(self, parser):
        parser.add_argument("server", nargs="?", metavar="SERVER", help="The server's slug.")
        parser.add_argument("--workspace", metavar="SLUG",
                            help="The server's workspace (needed when the slug exists in several).")
        parser.add_argument("--as-user", metavar="USERNAME",
                            help="Send this user's configured headers and secrets (for servers that need them).")
        parser.add_argument("--timeout", type=float, default=30, help="Seconds the discovery may take (30).")
        reg = parser.add_argument_group("registering a server")
        reg.add_argument("--register", action="store_true",
                         help="Create the server, or point it at --url (needs --workspace, --slug, --url).")
        reg.add_argument("--slug")
        reg.add_argument("--url")
        reg.add_argument("--name", default="", help="Its display name (default: the slug).")

    def handle(self, *args, server=None, workspace=None, as_user=None, timeout=30, register=False, slug=None,
               url=None, name="", **options):
        if register:
            target = self._register(workspace=workspace, slug=slug or server, url=url, name=name)
        elif server:
            target = self._lookup(server, workspace)
        else:
            raise CommandError("Name the server to sync (its slug), or --register one.")
        headers = {}
        if as_user:
            user = get_user_model().objects.filter(username=as_user).first()
            if user is None:
                raise CommandError(f"No user named {as_user!r}.")
            try:
                headers = mcp_headers_for(user=user, server=target)
            except McpError as exc:
                raise CommandError(str(exc)) from None
        try:
            version, changed = mcp_server_sync(server=target, headers=headers, timeout=timeout)
        except McpError as exc:
            raise CommandError(f"{target.workspace.slug}/{target.slug}: {exc}") from None
        state = "new version" if changed else "unchanged"
        tools = list(version.tools.order_by("name"))
        self.stdout.write(
            f"{target.workspace.slug}/{target.slug}: {state}: version {version.version or '(none reported)'}, "
            f"protocol {version.spec_version or '?'}, manifest {version.manifest_hash[:12]}, {len(tools)} tools")
        for tool in tools:
            summary = " ".join((tool.description or "").split())
            self.stdout.write(f"  {tool.name}" + (f": {summary[:100]}" if summary else ""))

    def _lookup(self, slug: str, workspace: str | None) -> McpServer:
        servers = McpServer.objects.filter(slug=slug).select_related("workspace")
        if workspace:
            servers = servers.filter(workspace__slug=workspace)
        found = list(servers[:10])
        if not found:
            where = f" in workspace {workspace!r}" if workspace else ""
            raise CommandError(f"No MCP server with the slug {slug!r}{where}.")
        if len(found) > 1:
            spaces = ", ".join(sorted(s.workspace.slug for s in found))
            raise CommandError(f"The slug {slug!r} exists in several workspaces ({spaces}): pass --workspace.")
        return found[0]

    def _register(self, *, workspace: str | None, slug: str | None, url: str | None, name: str) -> McpServer:
        if not (workspace and slug and url):
            raise CommandError("--register needs --workspace, --slug and --url.")
        space = Workspace.objects.filter(slug=workspace).first()
        if space is None:
            raise CommandError(f"No workspace with the slug {workspace!r}.")
        server = mcp_server_register(workspace=space, slug=slug, url=url, display_name=name)
        self.stdout.write(f"{space.slug}/{server.slug}: registered")
        return server
