from __future__ import annotations

from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.reverse import reverse

from workflows import dsl as dsl_module
from workflows.models import (
    McpServer,
    McpServerVersion,
    McpTool,
    Message,
    NodeInvocation,
    NodeVersion,
    UserServerConfig,
    VersionActivation,
    Workflow,
    WorkflowInvocation,
    WorkflowVersion,
)
from workspaces.api.base import WorkspaceField

MAX_INT = 2**31 - 1
NULLABLE_URI = {"type": "string", "format": "uri", "nullable": True}
USD = WorkflowInvocation._meta.get_field("usd_budget")
# NodeVersion's columns: a longer name would be a database error, not a message naming the node
NAME_LIMITS = {"nodeId": 200, "gatewayModelId": 200, "modelName": 200}
NODE_LIST_FIELDS = (*dsl_module.LIST_FIELDS, *(alias for alias, field in dsl_module.ALIASES.items()
                                                 if field in dsl_module.LIST_FIELDS))


def _link(request, name: str, pk, query: str = "") -> str | None:
    if pk is None:
        return None
    return reverse(name, args=[pk], request=request) + query


def _list_link(request, name: str, query: str) -> str:
    return reverse(name, request=request) + query


def check_dsl_shape(document) -> dict:
    """What DRF must catch before the DSL module sees the document: not an object, list fields that are not
    lists, names longer than their columns. Returns the document; raises ValidationError with the path."""
    if not isinstance(document, dict):
        raise serializers.ValidationError("Must be a JSON object with `entryNodeId` and `nodes`.")
    errors: dict[str, list[str]] = {}
    nodes = document.get("nodes")
    for index, node in enumerate(nodes if isinstance(nodes, list) else []):
        if not isinstance(node, dict):
            continue
        node_id = node.get("nodeId")
        path = f"nodes[{node_id}]" if isinstance(node_id, str) and node_id and len(node_id) <= 200 \
            else f"nodes[{index}]"
        for field in NODE_LIST_FIELDS:
            if node.get(field) is not None and not isinstance(node[field], list):
                errors.setdefault(f"{path}.{field}", []).append("must be a list of non-empty names")
        for field, limit in NAME_LIMITS.items():
            if isinstance(node.get(field), str) and len(node[field]) > limit:
                errors.setdefault(f"{path}.{field}", []).append(f"at most {limit} characters")
    if errors:
        raise serializers.ValidationError(errors)
    return document


@extend_schema_field({"type": "object", "additionalProperties": True,
                      "description": "A workflow DSL document: `entryNodeId`, `nodes` (see DESIGN.md)."})
class DslField(serializers.JSONField):
    def to_internal_value(self, data):
        return check_dsl_shape(super().to_internal_value(data))


# --------------------------------------------------------------------------------------- workflows

class WorkflowSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="workflow-detail")
    workspace = WorkspaceField()
    description = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    active_version = serializers.IntegerField(read_only=True, allow_null=True,
                                              help_text="The workflow's active version, if any.")
    version_count = serializers.IntegerField(read_only=True)
    versions_url = serializers.SerializerMethodField(help_text="Its versions (the version list, filtered).")
    activations_url = serializers.SerializerMethodField(help_text="Its activation history, newest first (what a "
                                                                  "rollback follows).")

    class Meta:
        model = Workflow
        fields = ["id", "url", "workspace", "name", "description", "owner", "active_version", "version_count",
                  "versions_url", "activations_url", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]
        validators = []  # the duplicate check in validate() names the `name` field

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None:
            fields["workspace"].read_only = True  # a workflow never moves to another workspace
        return fields

    def get_versions_url(self, obj) -> str:
        return _list_link(self.context.get("request"), "workflow-version-list", f"?workflow={obj.pk}")

    def get_activations_url(self, obj) -> str:
        return _list_link(self.context.get("request"), "workflow-activation-list", f"?workflow={obj.pk}")

    def validate(self, attrs):
        workspace = attrs.get("workspace", getattr(self.instance, "workspace", None))
        name = attrs.get("name", getattr(self.instance, "name", None))
        duplicate = Workflow.objects.filter(workspace=workspace, name=name)
        if self.instance is not None:
            duplicate = duplicate.exclude(pk=self.instance.pk)
        if duplicate.exists():
            raise serializers.ValidationError({"name": ["A workflow with this name exists in the workspace."]})
        return attrs


# ---------------------------------------------------------------------------------------- versions

class NodeVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = NodeVersion
        fields = ["id", "node_id", "description", "system_prompt", "llm_model", "tools", "handoffs", "handoff_type",
                  "waiting_for", "skills", "max_steps", "requires_approval", "memory"]
        read_only_fields = fields


class WorkflowVersionSerializer(serializers.ModelSerializer):
    """A version in a list: its genealogy and scores, without the DSL (the detail has it)."""

    url = serializers.HyperlinkedIdentityField(view_name="workflow-version-detail")
    workspace = serializers.IntegerField(source="workflow.workspace_id", read_only=True)
    workflow_name = serializers.CharField(source="workflow.name", read_only=True)
    parent1_url = serializers.SerializerMethodField()
    parent2_url = serializers.SerializerMethodField()
    children_url = serializers.SerializerMethodField(help_text="Versions with this one as a parent.")
    invocations_url = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = WorkflowVersion
        fields = ["id", "url", "workspace", "workflow", "workflow_name", "dsl_hash", "operation", "status",
                  "generation", "parent1", "parent1_url", "parent2", "parent2_url", "children_url", "commit_message",
                  "unresolved_tools", "avg_score", "pass_rate", "invocations_url", "created_by", "created_at",
                  "updated_at"]
        read_only_fields = fields

    @extend_schema_field(NULLABLE_URI)
    def get_parent1_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "workflow-version-detail", obj.parent1_id)

    @extend_schema_field(NULLABLE_URI)
    def get_parent2_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "workflow-version-detail", obj.parent2_id)

    def get_children_url(self, obj) -> str:
        return _list_link(self.context.get("request"), "workflow-version-list", f"?parent={obj.pk}")

    def get_invocations_url(self, obj) -> str:
        return _list_link(self.context.get("request"), "workflow-invocation-list", f"?version={obj.pk}")


class VersionActivationSerializer(serializers.ModelSerializer):
    """One activation of a version: by an activation (API, promotion) or a rollback. `parent` is the
    activation in effect before it; a rollback from the newest one re-activates its parent's version."""

    workspace = serializers.IntegerField(source="workflow.workspace_id", read_only=True)
    workflow_version_url = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)

    class Meta:
        model = VersionActivation
        fields = ["id", "workspace", "workflow", "workflow_version", "workflow_version_url", "previous_version",
                  "parent", "kind", "created_by", "created_at"]
        read_only_fields = fields

    def get_workflow_version_url(self, obj) -> str:
        return _link(self.context.get("request"), "workflow-version-detail", obj.workflow_version_id)


class WorkflowVersionDetailSerializer(WorkflowVersionSerializer):
    nodes = NodeVersionSerializer(many=True, read_only=True)

    class Meta(WorkflowVersionSerializer.Meta):
        fields = [*WorkflowVersionSerializer.Meta.fields, "dsl", "input_schema", "output_schema", "nodes"]
        read_only_fields = fields


class WorkflowVersionWrittenSerializer(WorkflowVersionDetailSerializer):
    created = serializers.BooleanField(read_only=True, help_text="False when the same DSL was already a version "
                                                                 "of the workflow (that version is returned).")

    class Meta(WorkflowVersionDetailSerializer.Meta):
        fields = [*WorkflowVersionDetailSerializer.Meta.fields, "created"]
        read_only_fields = fields


class WorkflowVersionCreateSerializer(serializers.Serializer):
    dsl = DslField(help_text="The workflow DSL; the same DSL twice is one version.")
    commit_message = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")
    operation = serializers.ChoiceField(choices=[WorkflowVersion.Operation.INIT, WorkflowVersion.Operation.MANUAL],
                                        required=False,
                                        help_text="Default: init for a workflow's first version, manual after.")
    parents = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=MAX_INT), required=False,
                                    default=list, max_length=2,
                                    help_text="Up to two versions of the same workflow this one derives from.")


class WorkflowImportSerializer(serializers.Serializer):
    workspace = WorkspaceField()
    workflow = serializers.CharField(max_length=200, required=False,
                                     help_text="The workflow to add the version to, created if missing (default: "
                                               "the document's `name`, else `imported-<hash prefix>`).")
    dsl = DslField(help_text="A DSL document, or a file written by `manage.py workflow export` / export/.")
    commit_message = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="")


class NodeChangeSerializer(serializers.Serializer):
    change = serializers.ChoiceField(choices=["added", "removed", "changed", "same"])
    fields = serializers.ListField(child=serializers.CharField())
    prompt_diff = serializers.ListField(child=serializers.CharField(), help_text="A unified diff of its prompt.")


class VersionDiffSerializer(serializers.Serializer):
    same = serializers.BooleanField()
    dsl_diff = serializers.ListField(child=serializers.CharField(), help_text="A unified diff of the canonical DSLs.")
    nodes = serializers.DictField(child=NodeChangeSerializer())

    def get_fields(self):
        fields = super().get_fields()
        # `from` is a Python keyword: declared here rather than as class attributes
        fields["from"] = serializers.CharField(help_text="The hash of the version compared against.")
        fields["to"] = serializers.CharField(help_text="The hash of this version.")
        return fields

    def to_representation(self, instance):
        nodes = {node_id: {"change": change["change"], "fields": change.get("fields", []),
                           "prompt_diff": change.get("prompt_diff", [])}
                 for node_id, change in instance["nodes"].items()}
        return super().to_representation({**instance, "nodes": nodes})


# ------------------------------------------------------------------------------------- invocations

class NodeInvocationSerializer(serializers.ModelSerializer):
    duration_ms = serializers.FloatField(read_only=True, allow_null=True)
    throttled = serializers.BooleanField(read_only=True, help_text=(
        "A model call of this running node waits on a timer for a provider limit or a rate limit to lift "
        "(throttle_reason says which; throttled_until when it is tried again)."))

    class Meta:
        model = NodeInvocation
        fields = ["id", "seq", "node_id", "node_version", "attempt", "status", "input", "output", "summary",
                  "next_nodes", "usd_cost", "input_tokens", "output_tokens", "llm_calls", "cache_hits", "tool_calls",
                  "model", "error", "approval", "throttled", "throttle_reason", "throttled_until", "started_at",
                  "ended_at", "duration_ms"]
        read_only_fields = fields


class WorkflowInvocationSerializer(serializers.ModelSerializer):
    """An invocation in a list: status and totals, without input, output or nodes."""

    url = serializers.HyperlinkedIdentityField(view_name="workflow-invocation-detail")
    workflow = serializers.IntegerField(source="workflow_pk", read_only=True)
    workflow_version_url = serializers.SerializerMethodField()
    durable_run = serializers.CharField(source="durable_run_id", read_only=True, allow_null=True,
                                        help_text="The id of the durable run that drives it.")
    durable_run_url = serializers.SerializerMethodField()
    messages_url = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = WorkflowInvocation
        fields = ["id", "url", "workspace", "workflow", "workflow_version", "workflow_version_url", "status", "error",
                  "node_budget", "usd_budget", "usd_cost", "input_tokens", "output_tokens", "llm_calls",
                  "cache_hits", "node_count", "fitness_score", "durable_run", "durable_run_url", "messages_url",
                  "created_by", "created_at", "updated_at", "started_at", "ended_at"]
        read_only_fields = fields

    def get_workflow_version_url(self, obj) -> str:
        return _link(self.context.get("request"), "workflow-version-detail", obj.workflow_version_id)

    @extend_schema_field(NULLABLE_URI)
    def get_durable_run_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "durable-run-detail", obj.durable_run_id)

    def get_messages_url(self, obj) -> str:
        return reverse("workflow-invocation-messages", args=[obj.pk], request=self.context.get("request"))


class WorkflowInvocationDetailSerializer(WorkflowInvocationSerializer):
    nodes = NodeInvocationSerializer(source="node_invocations", many=True, read_only=True,
                                     help_text="Its node invocations in seq order.")

    class Meta(WorkflowInvocationSerializer.Meta):
        fields = [*WorkflowInvocationSerializer.Meta.fields, "input", "output", "nodes"]
        read_only_fields = fields


class InvokeSerializer(serializers.Serializer):
    input = serializers.JSONField(required=False, allow_null=True, default=None,
                            help_text="Any JSON: the task the entry node receives.")
    node_budget = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1000,
                                           help_text="Node invocations it may run (default: WORKFLOW_NODE_BUDGET).")
    usd_budget = serializers.DecimalField(required=False, allow_null=True, max_digits=USD.max_digits,
                                          decimal_places=USD.decimal_places,
                                          min_value=Decimal(1).scaleb(-USD.decimal_places),
                                          max_value=Decimal(1_000_000),
                                          help_text="USD it may spend on model calls (default: WORKFLOW_USD_BUDGET).")


class DecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(max_length=10_000, required=False, allow_blank=True, default="",
                                    trim_whitespace=False)
    node_seq = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_INT,
                                        help_text="The waiting node invocation (default: the first one waiting).")


class InvocationCancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, default="cancelled by an operator")


class InvocationMessageSerializer(serializers.ModelSerializer):
    node_seq = serializers.IntegerField(read_only=True, allow_null=True,
                                        help_text="The seq of the node invocation it belongs to.")

    class Meta:
        model = Message
        fields = ["id", "seq", "node_invocation", "node_seq", "from_node_id", "to_node_id", "role", "payload",
                  "created_at"]
        read_only_fields = fields


# ------------------------------------------------------------------------------------ MCP registry

def public_url(url: str) -> str:
    """A server's address without the credentials a URL may carry (user:password@, the query string)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return ""
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, f"{host}:{port}" if port else host, parts.path, "", ""))


class McpToolSerializer(serializers.ModelSerializer):
    server = serializers.IntegerField(source="server_version.server_id", read_only=True)
    server_slug = serializers.CharField(source="server_version.server.slug", read_only=True)
    version_status = serializers.CharField(source="server_version.status", read_only=True)
    qualified_name = serializers.SerializerMethodField(help_text="What a node lists in `mcpTools`: slug/tool.")

    class Meta:
        model = McpTool
        fields = ["id", "name", "qualified_name", "description", "input_schema", "output_schema", "server",
                  "server_slug", "server_version", "version_status"]
        read_only_fields = fields

    def get_qualified_name(self, obj) -> str:
        return f"{obj.server_version.server.slug}/{obj.name}"


class McpServerToolSerializer(serializers.ModelSerializer):
    class Meta:
        model = McpTool
        fields = ["id", "name", "description", "input_schema", "output_schema"]
        read_only_fields = fields


class McpServerVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = McpServerVersion
        fields = ["id", "version", "spec_version", "capabilities", "manifest_hash", "status", "synced_at"]
        read_only_fields = fields


class McpServerSerializer(serializers.ModelSerializer):
    url = serializers.SerializerMethodField(help_text="Its address, without any credentials or query string.")
    repository_url = serializers.CharField(read_only=True)
    active_version = serializers.SerializerMethodField(help_text="What the last sync found (null: never synced).")
    tools = serializers.SerializerMethodField(help_text="The tools of the active version, by name.")

    class Meta:
        model = McpServer
        fields = ["id", "workspace", "slug", "display_name", "description", "repository_url", "url",
                  "active_version", "tools", "created_at", "updated_at"]
        read_only_fields = fields

    def get_url(self, obj) -> str:
        return public_url(obj.url)

    @staticmethod
    def _active(obj) -> McpServerVersion | None:
        versions = getattr(obj, "active_versions", None)
        if versions is None:  # not prefetched (a single server written elsewhere)
            versions = list(obj.versions.filter(status=McpServerVersion.Status.ACTIVE))
        return versions[0] if versions else None

    @extend_schema_field(McpServerVersionSerializer(allow_null=True))
    def get_active_version(self, obj):
        active = self._active(obj)
        return McpServerVersionSerializer(active).data if active is not None else None

    @extend_schema_field(McpServerToolSerializer(many=True))
    def get_tools(self, obj):
        active = self._active(obj)
        return McpServerToolSerializer(active.tools.all(), many=True).data if active is not None else []


class UserServerConfigSerializer(serializers.ModelSerializer):
    """The caller's own settings for a server. The secrets are never sent back, not even encrypted."""

    server_slug = serializers.CharField(source="server.slug", read_only=True)
    workspace = serializers.IntegerField(source="server.workspace_id", read_only=True)
    has_secrets = serializers.BooleanField(read_only=True, help_text="Secret headers are saved for this server.")

    class Meta:
        model = UserServerConfig
        fields = ["id", "server", "server_slug", "workspace", "config", "has_secrets", "enabled", "created_at",
                  "updated_at"]
        read_only_fields = fields
