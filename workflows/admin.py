"""Workflows in the admin: versions are read-only history (their DSL as pretty JSON, their nodes,
their parents); a workflow's name and description stay editable. Scoped to the user's workspaces."""

import json

from django.contrib import admin
from django.utils.html import format_html

from config.admin import ReadOnlyAdmin
from workflows.models import NodeVersion, Workflow, WorkflowVersion
from workspaces.admin_scope import WorkspaceScopedAdmin


@admin.register(Workflow)
class WorkflowAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    list_display = ("name", "workspace", "owner", "created_at")
    list_filter = [("workspace", admin.RelatedOnlyFieldListFilter)]  # only workspaces the user sees
    list_select_related = ("workspace", "owner")
    search_fields = ("name", "description")
    raw_id_fields = ("owner",)


class NodeVersionInline(admin.TabularInline):
    model = NodeVersion
    fields = ("node_id", "llm_model", "handoff_type", "handoffs", "waiting_for", "tools", "requires_approval")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "workflow__workspace"
    list_display = ("short_hash", "workflow", "status", "operation", "commit_message", "avg_score", "created_at")
    list_filter = ("status", "operation")
    list_select_related = ("workflow",)
    search_fields = ("=dsl_hash", "workflow__name", "commit_message")
    fields = ("workflow", "dsl_hash", "status", "operation", "parent1", "parent2", "commit_message",
              "unresolved_tools", "avg_score", "pass_rate", "created_at", "dsl_pretty")
    readonly_fields = fields
    inlines = (NodeVersionInline,)

    @admin.display(description="version", ordering="dsl_hash")
    def short_hash(self, version):
        return version.dsl_hash[:12]

    @admin.display(description="DSL")
    def dsl_pretty(self, version):
        return format_html("<pre>{}</pre>", json.dumps(version.dsl, indent=2, sort_keys=True, ensure_ascii=False))
