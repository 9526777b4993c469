"""The MCP registry: servers a workspace registers, what each sync found on them (versions and tools), and
each user's settings for a server (secret headers encrypted at rest). Models of the `workflows` app, imported
by `workflows/models.py` so the app registers them (tables `workflows_mcpserver`, ...).

A server's move to another host sets its users' configs aside: secret headers never follow a URL someone else
changed."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from config.crypto import EncryptedTextField
from workspaces.models import Workspace


class McpServer(models.Model):
    """An MCP server registered in a workspace, reached over streamable HTTP at `url`. A node names
    it in `mcpTools` by slug (all its tools) or as `slug/tool`."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="mcp_servers")
    slug = models.SlugField(max_length=100)
    display_name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    repository_url = models.URLField(blank=True, default="")
    url = models.URLField(max_length=500, help_text="Streamable HTTP endpoint, for example https://host/mcp")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "slug"], name="%(app_label)s_%(class)s_unique_slug"),
        ]
        verbose_name = "MCP server"

    def __str__(self) -> str:
        return self.slug

    def save(self, *args, **kwargs):
        """Moving the server to another host sets its users' configs aside (disabled): their secret
        headers must not follow a URL someone else changed. Each user re-enables theirs after checking
        the new address."""
        from django.db import transaction

        with transaction.atomic():  # the move and the configs set aside commit together
            moved = False
            if self.pk is not None:
                before = McpServer.objects.select_for_update().filter(pk=self.pk).values_list("url", flat=True).first()
                moved = before is not None and _host(before) != _host(self.url)
            super().save(*args, **kwargs)
            if moved:
                UserServerConfig.objects.filter(server=self, enabled=True).update(enabled=False)


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url or "").netloc.lower()


class McpServerVersion(models.Model):
    """What a sync found on a server: its reported version, capabilities and tools. A sync that
    finds the same manifest (hash of its tools) keeps the existing version."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        SUPERSEDED = "superseded", "Superseded"

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=100, blank=True, default="")
    spec_version = models.CharField(max_length=50, blank=True, default="")
    capabilities = models.JSONField(default=dict, blank=True)
    manifest_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.ACTIVE)
    synced_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["server", "manifest_hash"], name="%(app_label)s_%(class)s_unique_manifest"),
            models.UniqueConstraint(fields=["server"], condition=Q(status="active"),
                                    name="%(app_label)s_%(class)s_one_active"),
        ]
        verbose_name = "MCP server version"

    def __str__(self) -> str:
        return f"{self.server} {self.version or self.manifest_hash[:12]}"


class McpTool(models.Model):
    server_version = models.ForeignKey(McpServerVersion, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    input_schema = models.JSONField(default=dict, blank=True)
    output_schema = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["server_version", "name"], name="%(app_label)s_%(class)s_unique_name"),
        ]
        verbose_name = "MCP tool"

    def __str__(self) -> str:
        return self.name


class UserServerConfig(models.Model):
    """A user's settings for an MCP server: `config` (plain, e.g. extra headers) and `secrets` (a
    JSON object of headers such as Authorization, encrypted at rest), sent with each call the
    user's invocations make."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mcp_configs")
    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="user_configs")
    config = models.JSONField(default=dict, blank=True)
    secrets = EncryptedTextField(blank=True, default="")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "server"], name="%(app_label)s_%(class)s_unique_user_server"),
        ]
        verbose_name = "user MCP server config"

    def __str__(self) -> str:
        return f"{self.user} / {self.server}"
