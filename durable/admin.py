"""The operator dashboard for durable runs: read-only runs with their timeline, actions that act
only on eligible runs, editable schedules, read-only buffered signals and events."""

from __future__ import annotations

import json
import re

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from config.admin import EstimatedCountPaginator, ReadOnlyAdmin
from config.display import moment
from durable import selectors, services
from durable.codec import Undecodable, decode, decode_strict
from durable.models import BufferedEvent, BufferedSignal, DurableRun, RunAttribute, Schedule
from durable.registry import UnknownWorkflow, get_workflow, workflow_names
from durable.schedules import validate_schedule
from workspaces.admin_scope import WorkspaceScopedAdmin, sees_everything, workspaces_for

UNDECODABLE = "(undecodable)"
TIMELINE_LIMIT = 500


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def payload_html(text: str, *, column: str, row: str):
    """A stored payload as pretty JSON; a corrupt one shows "(undecodable)" (reported once) and never raises."""
    if not text:
        return "-"
    try:
        value = decode_strict(text)
    except Undecodable:
        decode(text, column=column, row=row)
        return format_html('<span class="undecodable">{}</span>', UNDECODABLE)
    return format_html('<pre class="durable-json">{}</pre>', pretty_json(value))


class WorkflowFilter(admin.SimpleListFilter):
    """Choices from the workflow registry: no DISTINCT over the runs table."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request, model_admin):
        return [(name, name) for name in workflow_names()]

    def queryset(self, request, queryset):
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class NamespaceFilter(admin.SimpleListFilter):
    """Choices from the workspaces (namespace "ws-<pk>") plus "default": no DISTINCT over the runs table."""

    title = "namespace"
    parameter_name = "namespace"

    def lookups(self, request, model_admin):
        choices = [("default", "default")] if sees_everything(request) else []
        choices += [(workspace.namespace, f"{workspace.name} ({workspace.namespace})")
                    for workspace in workspaces_for(request).order_by("name")[:200]]
        return choices

    def queryset(self, request, queryset):
        return queryset.filter(namespace=self.value()) if self.value() else queryset


class SignalForm(forms.Form):
    name = forms.CharField(max_length=255)
    payload = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), required=False,
                              help_text="JSON; empty sends null.")

    def clean_payload(self):
        text = self.cleaned_data["payload"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"Not valid JSON: {exc}") from None


@admin.register(DurableRun)
class DurableRunAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    namespace_field = "namespace"
    # compact columns, so the list fits a laptop screen beside the filters
    list_display = ("id", "workflow_name", "namespace", "status", "created", "ended", "turns", "recoveries")
    list_filter = ("status", WorkflowFilter, NamespaceFilter)
    search_fields = ("id",)
    search_help_text = "A run id, an attribute value, or key=value for one attribute."
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50
    actions = ("retry_runs", "cancel_runs", "signal_runs")
    change_form_template = "admin/durable/durablerun/change_form.html"
    fields = ("id", "workflow", "namespace", "status", "tags", "priority", "parent_link", "parent_seq", "turns",
              "recovery_attempts", "wake_pending", "wake_at", "locked_by", "locked_until", "created_at",
              "started_at", "updated_at", "ended_at", "input_pretty", "output_pretty", "error_pretty")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*selectors.PAYLOAD_COLUMNS)

    def get_object(self, request, object_id, from_field=None):
        # the change page shows the payloads: read them with the row, not one query each
        return self.scope(request, DurableRun.objects.filter(pk=object_id)).first()

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        # One id set, each part index-served: a run id prefix (an exact id is its own prefix; LIKE 'x%' goes
        # through the varchar_pattern_ops index Django creates for a CharField primary key,
        # durable_durablerun_id_<hash>_like, since the primary key's btree cannot serve LIKE under this
        # database's C.UTF-8 collation), an attribute value, or key=value. A UNION of ids lets Postgres join
        # it to the runs by primary key; OR-ing the parts on the runs table would scan every run.
        attributes = Q(value=term)
        key, sep, value = term.partition("=")
        if sep and key.strip():
            attributes |= Q(key=key.strip(), value=value.strip())
        ids = DurableRun.objects.filter(pk__startswith=term).values("pk").union(
            RunAttribute.objects.filter(attributes).values("run_id"))
        return queryset.filter(pk__in=ids), False

    @admin.display(description="workflow", ordering="workflow")
    def workflow_name(self, run):
        # a dotted name may break after its dots ("evolution.<wbr>generation"), never inside a word
        return format_html_join(format_html("<wbr>"), "{}", ((part,) for part in re.split(r"(?<=\.)", run.workflow)))

    @admin.display(description="created", ordering="created_at")
    def created(self, run):
        return moment(run.created_at)

    @admin.display(description="ended", ordering="ended_at")
    def ended(self, run):
        return moment(run.ended_at)

    @admin.display(description="recoveries", ordering="recovery_attempts")
    def recoveries(self, run):
        return run.recovery_attempts

    # ------------------------------------------------------------------------- change page

    @admin.display(description="parent")
    def parent_link(self, run):
        if not run.parent_id:
            return "-"
        url = reverse("admin:durable_durablerun_change", args=[quote(run.parent_id)])
        return format_html('<a href="{}">{}</a>', url, run.parent_id)

    @admin.display(description="input")
    def input_pretty(self, run):
        return payload_html(run.input, column="run.input", row=run.id)

    @admin.display(description="output")
    def output_pretty(self, run):
        return payload_html(run.output, column="run.output", row=run.id)

    @admin.display(description="error")
    def error_pretty(self, run):
        return payload_html(run.error, column="run.error", row=run.id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = dict(extra_context or {})
        run_id = unquote(object_id)
        if not self.get_queryset(request).filter(pk=run_id).exists():
            # missing, or of another workspace: the admin's redirect (super() reads the row with its payloads
            # once, below; this only asks whether it is in scope)
            return super().change_view(request, object_id, form_url, extra_context=extra_context)
        try:
            entries = selectors.run_timeline(run_id, include_payloads=True, limit=TIMELINE_LIMIT + 1)
        except services.RunNotFound:
            entries = []
        for entry in entries:
            entry.output_text = UNDECODABLE if "output" in entry.undecodable else (
                pretty_json(entry.output) if entry.output is not None else "")
            entry.error_text = UNDECODABLE if "error" in entry.undecodable else (
                pretty_json(entry.error) if entry.error is not None else "")
        children = list(self.scope(request, DurableRun.objects.filter(parent_id=run_id)).order_by("created_at", "id")
                        .values_list("id", "workflow", "status")[:200])
        attributes = [(key, selectors.attribute_value(value, number)) for key, value, number in
                      RunAttribute.objects.filter(run_id=run_id).order_by("key").values_list("key", "value",
                                                                                              "value_num")]
        extra_context.update(
            timeline=entries[:TIMELINE_LIMIT], timeline_truncated=len(entries) > TIMELINE_LIMIT,
            timeline_limit=TIMELINE_LIMIT,
            children=[(child_id, workflow, status, reverse("admin:durable_durablerun_change", args=[quote(child_id)]))
                      for child_id, workflow, status in children],
            attributes=attributes,
        )
        return super().change_view(request, object_id, form_url, extra_context=extra_context)

    # ------------------------------------------------------------------------------ actions

    def _eligible_ids(self, queryset, statuses) -> tuple[list[str], int]:
        selected = queryset.count()
        ids = list(queryset.filter(status__in=sorted(statuses)).order_by().values_list("id", flat=True)
                   [:services.BULK_LIMIT])
        return ids, selected

    @admin.action(description="Retry selected failed, cancelled or dead runs")
    def retry_runs(self, request, queryset):
        ids, selected = self._eligible_ids(queryset, DurableRun.Status.RETRYABLE)
        result = services.runs_bulk_retry(run_ids=ids)
        self.message_user(request, f"Retried {result['applied']} of {selected} selected runs "
                                   f"(only failed, cancelled or dead runs are retried; at most "
                                   f"{services.BULK_LIMIT} at once).", messages.SUCCESS)

    @admin.action(description="Cancel selected active runs")
    def cancel_runs(self, request, queryset):
        ids, selected = self._eligible_ids(queryset, DurableRun.Status.ACTIVE)
        result = services.runs_bulk_cancel(run_ids=ids, reason=f"cancelled by {request.user} in the admin")
        self.message_user(request, f"Cancelled {result['applied']} of {selected} selected runs "
                                   f"(only pending, running or suspended runs are cancelled; at most "
                                   f"{services.BULK_LIMIT} at once).", messages.SUCCESS)

    @admin.action(description="Send a signal to selected active runs…")
    def signal_runs(self, request, queryset):
        form = SignalForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            ids, selected = self._eligible_ids(queryset, DurableRun.Status.ACTIVE)
            outcomes = {"delivered": 0, "buffered": 0}
            for run_id in ids:
                try:
                    outcomes[services.signal_send(run_id=run_id, name=form.cleaned_data["name"],
                                                  payload=form.cleaned_data["payload"])] += 1
                except (services.RunNotFound, services.InvalidRunState):
                    continue  # ended since it was selected
            self.message_user(
                request,
                f"Signal {form.cleaned_data['name']!r} sent to {sum(outcomes.values())} of {selected} selected runs "
                f"({outcomes['delivered']} delivered, {outcomes['buffered']} buffered; only active runs get "
                "signals).", messages.SUCCESS,
            )
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Send a signal",
            "opts": self.model._meta,
            "form": form,
            "runs": list(queryset.order_by("-created_at").values_list("id", "status")[:100]),
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/durable/durablerun/signal.html", context)


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = ("key", "workflow", "namespace", "input", "every_seconds", "cron", "timezone", "paused", "overlap",
                  "jitter_seconds", "catchup_limit", "tags")

    def clean_workflow(self):
        name = self.cleaned_data["workflow"]
        try:
            get_workflow(name)
        except UnknownWorkflow as exc:
            raise ValidationError(str(exc)) from None
        return name

    def clean(self):
        data = super().clean()
        if not self.errors:
            try:
                validate_schedule(every_seconds=data.get("every_seconds"), cron=data.get("cron") or "",
                                  timezone_name=data.get("timezone") or "UTC")
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    self.add_error(field if field in self.fields else None, errors)
        return data


@admin.register(Schedule)
class ScheduleAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    namespace_field = "namespace"
    form = ScheduleForm
    list_display = ("key", "workflow", "namespace", "every_seconds", "cron", "timezone", "paused", "next_fire_at",
                    "last_fired_at", "last_run_id")
    list_filter = ("paused", "namespace")
    search_fields = ("key", "workflow")
    readonly_fields = ("next_fire_at", "last_fired_at", "last_run_id", "created_at", "updated_at")
    actions = ("pause_schedules", "resume_schedules")

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "namespace" and not sees_everything(request):
            # staff who are not superusers schedule only into their own workspaces' namespaces
            return forms.ChoiceField(label="namespace", choices=[
                (workspace.namespace, f"{workspace.name} ({workspace.namespace})")
                for workspace in workspaces_for(request).order_by("name")])
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        # schedule_save updates by (namespace, key): changing either would create a second schedule
        return (*self.readonly_fields, "key", "namespace") if obj is not None else self.readonly_fields

    def save_model(self, request, obj, form, change):
        saved = _schedule_save(obj)
        obj.pk, obj.next_fire_at = saved.pk, saved.next_fire_at

    def _set_paused(self, request, queryset, paused: bool):
        changed = 0
        for schedule in queryset.filter(paused=not paused):
            schedule.paused = paused
            _schedule_save(schedule)
            changed += 1
        self.message_user(request, f"{'Paused' if paused else 'Resumed'} {changed} schedules.", messages.SUCCESS)

    @admin.action(description="Pause selected schedules")
    def pause_schedules(self, request, queryset):
        self._set_paused(request, queryset, True)

    @admin.action(description="Resume selected schedules")
    def resume_schedules(self, request, queryset):
        self._set_paused(request, queryset, False)


def _schedule_save(schedule: Schedule) -> Schedule:
    return services.schedule_save(
        key=schedule.key, workflow=schedule.workflow, namespace=schedule.namespace, input=schedule.input,
        every_seconds=schedule.every_seconds, cron=schedule.cron, timezone_name=schedule.timezone,
        paused=schedule.paused, overlap=schedule.overlap, jitter_seconds=schedule.jitter_seconds,
        catchup_limit=schedule.catchup_limit, tags=schedule.tags,
    )


@admin.register(BufferedSignal)
class BufferedSignalAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    namespace_field = "run__namespace"
    list_display = ("id", "run_id", "name", "created_at")
    search_fields = ("=run__id", "=name")
    fields = ("run_id", "name", "payload_pretty", "created_at")
    readonly_fields = fields
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="payload")
    def payload_pretty(self, signal):
        return payload_html(signal.payload, column="signal.payload", row=str(signal.pk))


@admin.register(BufferedEvent)
class BufferedEventAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    namespace_field = "namespace"
    list_display = ("id", "namespace", "name", "created_at", "expires_at")
    list_filter = ("namespace",)
    search_fields = ("=name",)
    fields = ("namespace", "name", "payload_pretty", "created_at", "expires_at")
    readonly_fields = fields
    show_full_result_count = False
    paginator = EstimatedCountPaginator

    @admin.display(description="payload")
    def payload_pretty(self, event):
        return format_html('<pre class="durable-json">{}</pre>', pretty_json(event.payload))
