from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from durable.errors import UnknownWorkflow
from durable.models import DurableRun, Schedule
from durable.registry import get_workflow
from durable.schedules import validate_schedule
from durable.selectors import attribute_value
from workspaces.api.base import WorkspaceField


def workspace_id_of(namespace: str) -> int | None:
    prefix, _, pk = namespace.partition("-")
    return int(pk) if prefix == "ws" and pk.isdigit() else None


def api_startable(name: str) -> bool:
    """Whether members may start or schedule `name`: a workflow registered with `api=True`. The platform's
    own workflows (ingestion...) are started by the platform only, with inputs it has checked."""
    try:
        return get_workflow(name).api
    except UnknownWorkflow:
        return False


def _startable_workflow(name: str) -> str:
    if not api_startable(name):
        raise serializers.ValidationError(f"No durable workflow that can be started through the API is "
                                          f"registered as {name!r}.")
    return name


class RunSerializer(serializers.ModelSerializer):
    """A run in a list: no payloads. Attributes come from a prefetch (one query per page)."""

    workspace = serializers.SerializerMethodField()
    parent = serializers.CharField(source="parent_id", allow_null=True, read_only=True)
    attributes = serializers.SerializerMethodField()

    class Meta:
        model = DurableRun
        fields = ["id", "workflow", "namespace", "workspace", "status", "tags", "priority", "parent", "parent_seq",
                  "turns", "recovery_attempts", "wake_at", "created_at", "started_at", "updated_at", "ended_at",
                  "attributes"]
        read_only_fields = fields

    def get_workspace(self, run) -> int | None:
        return workspace_id_of(run.namespace)

    def get_attributes(self, run) -> dict:
        cache = getattr(run, "_prefetched_objects_cache", {})
        if "attributes" not in cache:
            return {}
        return {item.key: attribute_value(item.value, item.value_num) for item in cache["attributes"]}


class RunDetailSerializer(serializers.Serializer):
    """A run with decoded payloads; an undecodable payload reads as null and is named in `undecodable`."""

    run = RunSerializer()
    input = serializers.JSONField(allow_null=True)
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    undecodable = serializers.ListField(child=serializers.CharField())
    children = serializers.ListField(child=serializers.CharField())
    attributes = serializers.DictField()

    def to_representation(self, detail):
        data = super().to_representation(detail)
        run = data.pop("run")
        run["attributes"] = data.pop("attributes")
        return {**run, **data}


class RunDetailSchemaSerializer(RunSerializer):
    """The detail's shape, for the schema."""

    input = serializers.JSONField(allow_null=True)
    output = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    undecodable = serializers.ListField(child=serializers.CharField())
    children = serializers.ListField(child=serializers.CharField())

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "input", "output", "error", "undecodable", "children"]
        read_only_fields = fields


class RunStartSerializer(serializers.Serializer):
    workflow = serializers.CharField(max_length=200, validators=[_startable_workflow])
    workspace = WorkspaceField()
    input = serializers.JSONField(required=False, allow_null=True, default=None)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, default=list)
    priority = serializers.IntegerField(min_value=0, max_value=9, required=False, default=0)
    run_id = serializers.RegexField(r"^[A-Za-z0-9_.:@-]{1,200}$", required=False,
                                    help_text="Optional id, per workspace (stored as '<namespace>:<id>'; reads "
                                              "accept either); starting an existing id of yours returns that run.")


class SignalSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=255)
    payload = serializers.JSONField(required=False, allow_null=True, default=None)


class EventPublishSerializer(serializers.Serializer):
    workspace = WorkspaceField(help_text="The event reaches runs of this workspace only.")
    name = serializers.CharField(max_length=255)
    payload = serializers.DictField(required=False, default=dict,
                                    help_text="A JSON object; waiters whose match it contains receive it.")


class EventResultSerializer(serializers.Serializer):
    reached = serializers.IntegerField(help_text="Runs that were waiting for this event and received it.")
    buffered = serializers.BooleanField(help_text="No run was waiting: the event is kept until its TTL.")


class SignalResultSerializer(serializers.Serializer):
    result = serializers.ChoiceField(choices=["delivered", "buffered"])


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, default="cancelled by an operator")
    compensate = serializers.BooleanField(required=False, default=False,
                                          help_text="Also start the workflow's registered compensation workflow.")


class RetrySerializer(serializers.Serializer):
    input = serializers.JSONField(required=False, allow_null=True,
                                  help_text="When given, the run starts over from its first step with this input.")


class BulkResultSerializer(serializers.Serializer):
    matched = serializers.IntegerField(help_text="Eligible runs matching the filters (at most `limit`).")
    applied = serializers.IntegerField(help_text="Runs actually changed.")
    limit = serializers.IntegerField()
    more = serializers.BooleanField(help_text="More eligible runs match than one call handles.")


class FacetsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    status = serializers.DictField(child=serializers.IntegerField())
    workflow = serializers.DictField(child=serializers.IntegerField())


class TimelineEntrySerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField()
    status = serializers.CharField()
    attempt = serializers.IntegerField()
    parallel_group = serializers.IntegerField(allow_null=True)
    queue = serializers.CharField()
    child_run_id = serializers.CharField()
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    queue_seconds = serializers.FloatField(allow_null=True, help_text="started_at - created_at")
    run_seconds = serializers.FloatField(allow_null=True, help_text="completed_at - started_at")
    input = serializers.JSONField(allow_null=True, required=False, help_text="Only with ?payloads=1.")
    output = serializers.JSONField(allow_null=True, required=False, help_text="Only with ?payloads=1.")
    error = serializers.JSONField(allow_null=True, required=False, help_text="Only with ?payloads=1.")
    undecodable = serializers.ListField(child=serializers.CharField(), required=False)

    def to_representation(self, entry):
        data = super().to_representation(entry)
        if not entry.payloads_included:
            for name in ("input", "output", "error", "undecodable"):
                data.pop(name, None)
        return data


class TimelineSerializer(serializers.Serializer):
    run = serializers.CharField()
    checkpoints = TimelineEntrySerializer(many=True)
    next_after = serializers.IntegerField(allow_null=True, help_text="Pass as ?after= for the next page.")


class FanBucketSerializer(serializers.Serializer):
    parallel_group = serializers.IntegerField(allow_null=True)
    status = serializers.CharField()
    kind = serializers.CharField()
    count = serializers.IntegerField()
    min_seq = serializers.IntegerField()
    max_seq = serializers.IntegerField()
    first_created_at = serializers.DateTimeField(allow_null=True)
    first_started_at = serializers.DateTimeField(allow_null=True)
    last_completed_at = serializers.DateTimeField(allow_null=True)
    attempts = serializers.IntegerField()


class FanStatsSerializer(serializers.Serializer):
    run = serializers.CharField()
    buckets = FanBucketSerializer(many=True)


class ScheduleSerializer(serializers.ModelSerializer):
    """Schedules are written through durable.services.schedule_save; `workspace` is set at creation."""

    workspace = WorkspaceField(write_only=True)
    workspace_id = serializers.SerializerMethodField()
    workflow = serializers.CharField(max_length=200, validators=[_startable_workflow])

    class Meta:
        model = Schedule
        fields = ["id", "key", "workflow", "workspace", "workspace_id", "namespace", "input", "every_seconds", "cron",
                  "timezone", "paused", "overlap", "jitter_seconds", "catchup_limit", "tags", "next_fire_at",
                  "last_fired_at", "last_run_id", "created_at", "updated_at"]
        read_only_fields = ["id", "namespace", "next_fire_at", "last_fired_at", "last_run_id", "created_at",
                            "updated_at"]
        extra_kwargs = {"key": {"validators": []}}  # uniqueness is checked under a lock in the view

    def get_workspace_id(self, schedule) -> int | None:
        return workspace_id_of(schedule.namespace)

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None:
            # the key names the row schedule_save updates and the namespace is its workspace: both fixed
            fields["key"].read_only = True
            fields["workspace"].read_only = True
            fields["workspace"].required = False
        return fields

    def validate(self, attrs):
        current = self.instance
        every = attrs.get("every_seconds", getattr(current, "every_seconds", None))
        cron = attrs.get("cron", getattr(current, "cron", ""))
        if "every_seconds" in attrs and "cron" not in attrs and every:
            cron = ""
        if "cron" in attrs and "every_seconds" not in attrs and cron:
            every = None
        try:
            validate_schedule(every_seconds=every, cron=cron or "",
                              timezone_name=attrs.get("timezone", getattr(current, "timezone", "UTC")))
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        attrs["every_seconds"], attrs["cron"] = every, cron or ""
        return attrs
