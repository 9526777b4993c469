"""Evals in the admin, scoped to the staff user's workspaces (superusers see every workspace).

- Golden sets: editable, with their items inline (input, rubric, tags and metadata as JSON, checked by
  `services.item_errors`; graders checked by `graders.validate_graders`, an error naming the entry and
  option). The change page starts an eval run of a version of the set's workflow, lists the set's
  recent runs, and links to the item import page (JSON Lines or CSV read by evals/importing.py, written
  by `services.golden_items_import`: all or nothing, each bad line named) and to the compare page.
- Run, import, compare (a golden set's `compare/?a=<version>&b=<version>`: the paired comparison of two
  versions' latest completed runs on the set, a slope chart, the verdict, critical regressions
  highlighted), promote and rollback are the golden set's own pages, in evals/admin_views.py.
- Eval runs: read-only. The change page shows the configuration and aggregates, a score histogram
  (server-rendered SVG), every item's result, a link to the durable run, a Cancel button while the
  run is active and a Propose rewrite button (`rewriter.propose`) once it completed.
- Golden results (append-only) and promotions (history): read-only, payloads as pretty JSON.
- A workflow invocation's page gets the results that graded it and an "Add to golden set" form, posted to the
  golden items' `from-invocation/` view (evals/admin_invocation.py), drawn there as a change-page panel.

Every POST view refuses GET (405), is CSRF-protected (`admin_view`), treats another workspace's
object as a missing one (as the change page does), and needs the model's change permission: the
golden set's for run, import, promote and rollback; the eval run's for cancel and propose (the eval
run admin itself stays read-only).
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import ValidationError
from django.db.models import Case, Count, IntegerField, Max, OuterRef, Q, Subquery, When
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.forms.models import BaseInlineFormSet
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from config.admin import EstimatedCountPaginator, NamedObjectMixin, PostActionsMixin, ReadOnlyAdmin, change_page_panels
from config.display import clipped, durable_run_link, excerpt, json_html, number_field, pretty_json, status_badge, usd
from config.display import percent as percent_text
from config.display import score as score_text
from config.display import seconds as seconds_text
from evals import charts, importing, rewriter
from evals.admin_invocation import ItemFromInvocationViews, invocation_evals_panel
from evals.admin_views import (
    EXCERPT,
    VERSION_CHOICES,
    GoldenSetViews,
    RunForm,
    full_runs,
    p_text,
    signed_text,
    slim_version,
)
from evals.graders import GraderConfigError, validate_graders
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet, Promotion
from evals.selectors import score_histogram, split_plan
from evals.services import (
    EvalError,
    GoldenSetBusy,
    eval_run_cancel,
    eval_run_start,
    golden_items_deal_splits,
    golden_set_ensure_idle,
    item_errors,
)
from evals.splits import SPLITS
from workflows.execution import input_text
from workflows.models import WorkflowInvocation, WorkflowVersion
from workspaces.admin_scope import (
    ScopedChoiceFilter,
    WorkspaceFilter,
    WorkspaceScopedAdmin,
    full_object,
    workspaces_for,
)

# a workflow invocation's page shows the results that graded it and a form adding it to a golden set
change_page_panels.register(WorkflowInvocation, invocation_evals_panel)

RESULT_LIMIT = 1000  # results shown on an eval run's page; the golden results list pages through the rest
RECENT_RUNS = 10  # runs listed on a golden set's page
LONG_TEXT = 300  # longer expected and actual outputs start collapsed in the results table


def admin_link(model: str, pk, label):
    """A link to an admin change page (`model` is "app_model"); "-" without a pk."""
    if pk is None:
        return "-"
    return format_html('<a href="{}">{}</a>', reverse(f"admin:{model}_change", args=[quote(pk)]), label)


def version_label(version: WorkflowVersion | None) -> str:
    return version.dsl_hash[:12] if version is not None else "-"


def item_text(value) -> str:
    """An item input in full: a string as is, anything else as pretty JSON (its excerpt is the text the
    workflow reads, `input_text`)."""
    if isinstance(value, str):
        return value
    return pretty_json(value)


def graders_summary(graders) -> str:
    """"contains (weight 2) + token_f1": each grader's kind and, when it is not 1, its weight."""
    if not isinstance(graders, list) or not graders:
        return "-"
    parts = []
    for entry in graders:
        if not isinstance(entry, dict):
            parts.append("?")
            continue
        kind, weight = str(entry.get("kind", "?")), entry.get("weight", 1)
        plain = weight in (1, 1.0, None) or not isinstance(weight, int | float)
        parts.append(kind if plain else f"{kind} (weight {weight:g})")
    return " + ".join(parts)


# ---------------------------------------------------------------------------------------- golden sets

class PrettyJSONField(forms.JSONField):
    """JSON shown indented (a grader configuration reads better one option a line)."""

    def prepare_value(self, value):
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, ensure_ascii=False, indent=2, cls=self.encoder)


class InputJSONField(forms.JSONField):
    """An item input: a new item's empty input shows as an empty box, not "null" (an input is required)."""

    def prepare_value(self, value):
        return "" if value is None else super().prepare_value(value)


class GoldenSetForm(forms.ModelForm):
    class Meta:
        model = GoldenSet
        fields = ("workspace", "name", "workflow", "description", "pass_threshold", "graders")
        field_classes = {"graders": PrettyJSONField}
        widgets = {"graders": forms.Textarea(attrs={"rows": 8, "cols": 90, "class": "ev-json-input"}),
                   "description": forms.Textarea(attrs={"rows": 2, "cols": 90})}
        help_texts = {"graders": 'A JSON list of 1 to 10 graders, e.g. [{"kind": "contains", "weight": 2}, '
                                 '{"kind": "token_f1"}]; kinds: exact, contains, regex, token_f1, json_fields, '
                                 "numeric, json_schema, llm_judge (evals/graders/guide.md lists their options)."}

    def clean_graders(self):
        try:
            return validate_graders(self.cleaned_data.get("graders"))
        except GraderConfigError as exc:
            raise ValidationError([f"{path}: {message}" for path, problems in exc.errors.items()
                                   for message in problems]) from None

    def clean(self):
        data = super().clean()
        workspace = data.get("workspace")
        workspace_id = workspace.pk if workspace is not None else self.instance.workspace_id
        workflow = data.get("workflow")
        if workflow is not None and workspace_id is not None and workflow.workspace_id != workspace_id:
            self.add_error("workflow", "This workflow belongs to another workspace.")
        name = data.get("name")
        if name and workspace_id is not None and "workspace" not in self.fields and GoldenSet.objects.filter(
                workspace_id=workspace_id, name=name).exclude(pk=self.instance.pk).exists():
            # the workspace is read-only on the change page, so the form's constraint check skips it
            self.add_error("name", "A golden set with this name exists in the workspace.")
        return data


class GoldenItemForm(forms.ModelForm):
    position = forms.IntegerField(required=False, min_value=0,
                                  help_text="Empty puts a new item last.")
    split = forms.ChoiceField(choices=[("", "deal"), *GoldenItem.Split.choices], required=False,
                              help_text="Empty deals a new item one by its first tag.")

    class Meta:
        model = GoldenItem
        fields = ("position", "input", "expected_output", "scoring_criteria", "rubric", "tags", "metadata", "split")
        field_classes = {"input": InputJSONField}
        widgets = {name: forms.Textarea(attrs={"rows": 3, "cols": 26 if name in ("input", "expected_output") else 16})
                   for name in ("input", "expected_output", "scoring_criteria", "rubric", "tags", "metadata")}

    EMPTY = {"rubric": list, "tags": list, "metadata": dict}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["position"].widget.attrs["style"] = "width: 4em"
        self.fields["input"].help_text = 'JSON: {"text": "..."} or a quoted string.'
        if self.instance._state.adding:
            self.initial["position"] = None
        else:  # an item keeps a split: only a new one is dealt
            self.fields["split"].required = True
            self.fields["split"].choices = GoldenItem.Split.choices

    def clean(self):
        data = super().clean()
        for name, empty in self.EMPTY.items():
            if name in data and data[name] is None:
                data[name] = empty()
        for name in ("input", "rubric", "tags", "metadata"):
            problem = importing.value_problem(data.get(name))
            if problem and name not in self.errors:
                self.add_error(name, problem)
        problems = item_errors(input=data.get("input"), expected_output=data.get("expected_output", ""),
                               scoring_criteria=data.get("scoring_criteria", ""), rubric=data.get("rubric"),
                               tags=data.get("tags"), metadata=data.get("metadata"))
        for name, found in problems.items():
            if name in self.fields and name not in self.errors:
                self.add_error(name, found)
        return data


class GoldenItemFormSet(BaseInlineFormSet):
    def clean(self):
        super().clean()
        doomed = [form.instance.pk for form in self.deleted_forms if form.instance.pk]
        edited = [form for form in self.initial_forms if form.has_changed() and form not in self.deleted_forms]
        if (doomed or edited) and self.instance.pk is not None:
            try:  # the admin's change view validates and saves in one transaction, as the API's guard does
                golden_set_ensure_idle(golden_set_id=self.instance.pk)
            except GoldenSetBusy as exc:
                raise ValidationError(exc.message) from None
        if doomed:
            graded = set(GoldenResult.objects.filter(golden_item_id__in=doomed)
                         .values_list("golden_item_id", flat=True).distinct())
            if graded:
                raise ValidationError(
                    f"{len(graded)} item(s) marked for deletion have results of eval runs, which are append-only "
                    "history; edit them instead (a changed item is run again).")


class GoldenItemInline(admin.TabularInline):
    model = GoldenItem
    form = GoldenItemForm
    formset = GoldenItemFormSet
    fields = ("position", "input", "expected_output", "scoring_criteria", "rubric", "tags", "metadata", "split")
    extra = 1
    ordering = ("position", "id")


@admin.register(GoldenSet)
class GoldenSetAdmin(GoldenSetViews, WorkspaceScopedAdmin, admin.ModelAdmin):
    form = GoldenSetForm
    inlines = (GoldenItemInline,)
    list_display = ("name", "workspace", "workflow", "item_count", "splits_display", "pass_threshold",
                    "graders_display", "last_run_display")
    list_filter = (WorkspaceFilter,)
    list_select_related = ("workspace", "workflow")
    search_fields = ("name", "description")
    ordering = ("name", "id")
    actions = ("run_active_versions",)
    change_form_template = "admin/evals/goldenset/change_form.html"

    def get_queryset(self, request):
        # the set's score is its active version's: evolution's newest candidates are not the set's state
        active_first = Case(When(workflow_version__status=WorkflowVersion.Status.ACTIVE, then=0), default=1)
        latest = full_runs(EvalRun.objects.filter(golden_set=OuterRef("pk"), status=EvalRun.Status.COMPLETED)) \
            .order_by(active_first, "-ended_at", "-pk")
        def items(**among):
            counted = GoldenItem.objects.filter(golden_set=OuterRef("pk"), **among).order_by().values("golden_set")
            return Coalesce(Subquery(counted.annotate(n=Count("pk")).values("n"), output_field=IntegerField()), 0)

        return super().get_queryset(request).annotate(
            items_n=items(), **{f"{split}_n": items(split=split) for split in SPLITS},
            last_run_id=Subquery(latest.values("pk")[:1]),
            last_run_score=Subquery(latest.values("avg_score")[:1]),
            last_run_pass_rate=Subquery(latest.values("pass_rate")[:1]))

    def get_object(self, request, object_id, from_field=None):
        return full_object(self, request, GoldenSet.objects.select_related("workspace", "workflow"), object_id)

    def get_readonly_fields(self, request, obj=None):
        # a set's runs and results live in its workspace: it does not move
        return ("workspace",) if obj is not None else ()

    @admin.display(description="items", ordering="items_n")
    def item_count(self, golden_set):
        return golden_set.items_n

    @admin.display(description="train / validation / test")
    def splits_display(self, golden_set):
        plan = split_plan(golden_set, counts={split: getattr(golden_set, f"{split}_n") for split in SPLITS})
        counts = " / ".join(str(plan.counts[split]) for split in SPLITS)
        if plan.held_out:
            return counts
        return format_html('{} <span class="wf-muted" title="{}">(no held-out claim)</span>', counts, plan.reason)

    @admin.display(description="graders")
    def graders_display(self, golden_set):
        return graders_summary(golden_set.graders)

    @admin.display(description="active version's score", ordering="last_run_score")
    def last_run_display(self, golden_set):
        if golden_set.last_run_id is None:
            return "-"
        return format_html('<a href="{}">{}</a> <span class="wf-muted">(pass {})</span>',
                           reverse("admin:evals_evalrun_change", args=[golden_set.last_run_id]),
                           score_text(golden_set.last_run_score), percent_text(golden_set.last_run_pass_rate))

    def save_model(self, request, obj, form, change):
        if not change and obj.created_by_id is None:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)

    def save_formset(self, request, form, formset, change):
        if formset.model is not GoldenItem:
            return super().save_formset(request, form, formset, change)
        items = formset.save(commit=False)
        for item in formset.deleted_objects:
            item.delete()
        last = GoldenItem.objects.filter(golden_set=form.instance).aggregate(last=Max("position"))["last"] or 0
        last = max([last, *(item.position for item in items if item.position is not None)])
        for item in items:
            if item.position is None:
                last += 1
                item.position = last
        new = [item for item in items if item._state.adding]
        if new:  # dealing reads the set's items under its row lock: not for a save that only edits
            golden_items_deal_splits(golden_set=form.instance, items=new)
        for item in items:
            item.save()
        formset.save_m2m()

    # ------------------------------------------------------------------------------------ change page

    def run_versions(self, golden_set: GoldenSet):
        if golden_set.workflow_id is None:
            return WorkflowVersion.objects.none()
        return WorkflowVersion.objects.filter(workflow_id=golden_set.workflow_id).defer(*slim_version()) \
            .order_by("-created_at", "-pk")

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.set_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def set_context(self, request, golden_set: GoldenSet) -> dict:
        versions = self.run_versions(golden_set)
        offered = list(versions[:VERSION_CHOICES]) if golden_set.workflow_id else []
        active = next((v.pk for v in offered if v.status == WorkflowVersion.Status.ACTIVE), None)
        form = RunForm(versions=versions, offered=offered, initial={"version": active, "reuse": True})
        runs = list(EvalRun.objects.filter(golden_set=golden_set).select_related("workflow_version")
                    .defer(*slim_version("workflow_version__"), "config", "regression")
                    .order_by("-created_at", "-pk")[:RECENT_RUNS])
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        plan = split_plan(golden_set)
        return {
            "split_plan": plan,
            "split_rows": [{"name": name or "(no tag)", "counts": [row[split] for split in SPLITS]}
                           for name, row in plan.strata.items()],
            "split_counts": [plan.counts[split] for split in SPLITS],
            "split_shares": [f"{plan.proportions[split]:.0%}" for split in SPLITS],
            "split_names": SPLITS,
            "items_url": reverse("admin:evals_goldenitem_changelist") + f"?golden_set={golden_set.pk}",
            "can_act": self.has_change_permission(request, golden_set),
            "run_form": form if golden_set.workflow_id else None,
            "run_url": reverse(f"admin:{info}_run", args=[quote(golden_set.pk)]),
            "import_url": reverse(f"admin:{info}_import", args=[quote(golden_set.pk)]),
            "compare_url": reverse(f"admin:{info}_compare", args=[quote(golden_set.pk)]),
            "runs_url": reverse("admin:evals_evalrun_changelist") + f"?golden_set={golden_set.pk}",
            "recent_runs": [{
                "pk": run.pk, "url": reverse("admin:evals_evalrun_change", args=[run.pk]),
                "version": version_label(run.workflow_version), "status": run.status,
                "status_label": run.get_status_display(), "avg_score": score_text(run.avg_score),
                "pass_rate": percent_text(run.pass_rate), "progress": f"{run.items_done} / {run.items_total}",
                "created_at": run.created_at,
            } for run in runs],
        }

    def has_run_permission(self, request):
        return self.has_change_permission(request)

    @admin.action(description="Run an eval of each selected set's active version", permissions=["run"])
    def run_active_versions(self, request, queryset):
        selected = queryset.count()
        sets = list(queryset.filter(workflow__versions__status=WorkflowVersion.Status.ACTIVE)
                    .select_related("workflow").order_by("pk")[:50])
        actives = {v.workflow_id: v for v in WorkflowVersion.objects.filter(
            workflow_id__in=[s.workflow_id for s in sets], status=WorkflowVersion.Status.ACTIVE)}
        started, refused = 0, []
        for golden_set in sets:
            try:
                eval_run_start(golden_set=golden_set, version=actives[golden_set.workflow_id], user=request.user)
                started += 1
            except EvalError as exc:
                refused.append(f"{golden_set.name}: {exc}")
        self.message_user(request, f"Started {started} eval run(s) for {selected} selected set(s) (only sets whose "
                                   "workflow has an active version are run; at most 50 at once).",
                          messages.SUCCESS if started else messages.WARNING)
        for problem in refused:
            self.message_user(request, f"Not started: {problem}", messages.ERROR)


# ------------------------------------------------------------------------------------------ eval runs

class GoldenSetFilter(ScopedChoiceFilter):
    title, parameter_name, field = "golden set", "golden_set", "golden_set_id"

    def options(self, request):
        return GoldenSet.objects.filter(workspace__in=workspaces_for(request)).order_by("name", "pk") \
            .values_list("pk", "name")


class ItemWorkspaceFilter(WorkspaceFilter):
    field = "golden_set__workspace_id"


@admin.register(GoldenItem)
class GoldenItemAdmin(ItemFromInvocationViews, NamedObjectMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    """Every item of the user's sets with its split, to read and filter across sets; an item is edited on its
    set's page (which refuses changes while an eval run of the set is in progress), or added from an invocation
    (evals/admin_invocation.py)."""

    workspace_field = "golden_set__workspace"
    list_display = ("id", "golden_set_link", "position", "input_display", "tags_display", "split")
    list_display_links = ("id",)
    list_filter = ("split", GoldenSetFilter, ItemWorkspaceFilter)
    list_select_related = ("golden_set",)
    search_fields = ("=metadata__key",)
    search_help_text = "An item's seeded key."
    ordering = ("golden_set__name", "golden_set_id", "position", "id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    change_form_template = "admin/evals/change_form.html"
    fields = ("golden_set_link", "position", "split", "input_pretty", "expected_output", "scoring_criteria",
              "rubric_pretty", "tags_display", "metadata_pretty", "content_hash", "created_at", "updated_at")
    readonly_fields = fields

    def object_name(self, item) -> str:
        return f"{excerpt(input_text(item.input), 60)} · {item.get_split_display()}"

    def get_queryset(self, request):
        return super().get_queryset(request).defer("expected_output", "scoring_criteria", "rubric",
                                                   "golden_set__graders", "golden_set__description")

    def get_object(self, request, object_id, from_field=None):
        return full_object(self, request, GoldenItem.objects.select_related("golden_set"), object_id)

    @admin.display(description="golden set", ordering="golden_set__name")
    def golden_set_link(self, item):
        return admin_link("evals_goldenset", item.golden_set_id, item.golden_set.name)

    @admin.display(description="input")
    def input_display(self, item):
        return excerpt(input_text(item.input), EXCERPT)

    @admin.display(description="tags")
    def tags_display(self, item):
        return ", ".join(item.tags) if isinstance(item.tags, list) and item.tags else "-"

    @admin.display(description="input")
    def input_pretty(self, item):
        return json_html(item.input)

    @admin.display(description="rubric")
    def rubric_pretty(self, item):
        return json_html(item.rubric)

    @admin.display(description="metadata")
    def metadata_pretty(self, item):
        return json_html(item.metadata)


@admin.register(EvalRun)
class EvalRunAdmin(NamedObjectMixin, PostActionsMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    list_display = ("id", "golden_set_link", "version_link", "status_display", "avg_score_display",
                    "pass_rate_display", "fitness_display", "cost", "progress", "created_at")
    list_display_links = ("id",)
    list_filter = ("status", "origin", GoldenSetFilter, WorkspaceFilter)
    list_select_related = ("golden_set", "workflow_version__workflow")
    search_fields = ("id",)  # see get_search_results
    search_help_text = "An eval run id, a durable run id, the start of a version hash, or a golden set's name."
    ordering = ("-created_at", "-id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 50
    actions = ("cancel_eval_runs",)
    change_form_template = "admin/evals/evalrun/change_form.html"
    fieldsets = (
        (None, {"fields": ("golden_set_link", "version_link", "status_display", "origin", "reuse", "created_by",
                           "created_at", "started_at", "ended_at", "duration_display", "run_link", "error_pretty")}),
        ("Aggregates", {"fields": ("avg_score_display", "pass_rate_display", "fitness_display", "progress",
                                   "grading_errors", "cost_display", "latency_display", "regression_pretty")}),
        ("Configuration", {"fields": ("config_pretty",)}),
    )
    readonly_fields = ("golden_set_link", "version_link", "status_display", "origin", "reuse", "created_by",
                       "created_at", "started_at", "ended_at", "duration_display", "run_link", "error_pretty",
                       "avg_score_display", "pass_rate_display", "fitness_display", "progress", "grading_errors",
                       "cost_display", "latency_display", "regression_pretty", "config_pretty")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("golden_set", "workflow_version__workflow").defer(
            "config", "regression", "error", "golden_set__graders", "golden_set__description",
            *slim_version("workflow_version__"))

    def get_object(self, request, object_id, from_field=None):
        queryset = EvalRun.objects.select_related("golden_set", "workflow_version__workflow", "created_by") \
            .defer(*slim_version("workflow_version__"))
        return full_object(self, request, queryset, object_id)

    def object_name(self, run) -> str:
        return (f"Eval run {run.pk} of {run.workflow_version.workflow.name} @ {version_label(run.workflow_version)} "
                f"on {run.golden_set.name}")

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(durable_run_id=term) | Q(golden_set__name__icontains=term)
        if term.isdigit() and term.isascii():
            match |= Q(pk=int(term))
        if all(c in "0123456789abcdefABCDEF" for c in term) and 6 <= len(term) <= 64:
            match |= Q(workflow_version__dsl_hash__startswith=term.lower())
        return queryset.filter(match), False

    # ------------------------------------------------------------------------------ columns and fields

    @admin.display(description="golden set", ordering="golden_set__name")
    def golden_set_link(self, run):
        return admin_link("evals_goldenset", run.golden_set_id, run.golden_set.name)

    @admin.display(description="version")
    def version_link(self, run):
        version = run.workflow_version
        return format_html('<a href="{}">{}</a> <span class="wf-muted">{}</span>',
                           reverse("admin:workflows_workflowversion_change", args=[version.pk]),
                           version.dsl_hash[:12], version.workflow.name)

    @admin.display(description="status", ordering="status")
    def status_display(self, run):
        return status_badge(run.status, run.get_status_display())

    @admin.display(description="avg score", ordering="avg_score")
    def avg_score_display(self, run):
        return score_text(run.avg_score)

    @admin.display(description="pass rate", ordering="pass_rate")
    def pass_rate_display(self, run):
        return percent_text(run.pass_rate)

    @admin.display(description="fitness", ordering="fitness")
    def fitness_display(self, run):
        return "-" if run.fitness is None else f"{run.fitness:.1f}"

    @admin.display(description="cost", ordering="usd_cost")
    def cost(self, run):
        return usd(run.usd_cost)

    @admin.display(description="items done / total")
    def progress(self, run):
        text = f"{run.items_done} / {run.items_total}"
        return f"{text} ({run.items_reused} reused)" if run.items_reused else text

    @admin.display(description="cost")
    def cost_display(self, run):
        return (f"{usd(run.usd_cost)} for the version's invocations ({usd(run.paid_usd)} paid by this run, the rest "
                f"reused); judge {usd(run.judge_usd)}")

    @admin.display(description="latency per item")
    def latency_display(self, run):
        if run.latency_p50_ms is None:
            return "-"
        return f"p50 {seconds_text(run.latency_p50_ms / 1000)}, p95 {seconds_text((run.latency_p95_ms or 0) / 1000)}"

    @admin.display(description="duration")
    def duration_display(self, run):
        if run.started_at is None:
            return "-"
        if run.ended_at is None:
            return f"{seconds_text((timezone.now() - run.started_at).total_seconds())} so far"
        return seconds_text((run.ended_at - run.started_at).total_seconds())

    @admin.display(description="durable run")
    def run_link(self, run):
        return durable_run_link(run.durable_run_id)

    @admin.display(description="error")
    def error_pretty(self, run):
        return format_html('<pre class="wf-json wf-error">{}</pre>', run.error) if run.error else "-"

    @admin.display(description="regression")
    def regression_pretty(self, run):
        return json_html(run.regression)

    @admin.display(description="configuration")
    def config_pretty(self, run):
        return json_html(run.config)

    # ------------------------------------------------------------------------------------ change page

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.run_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def run_context(self, request, run: EvalRun) -> dict:
        shown = request.GET.get("results")
        shown = shown if shown in RESULT_FILTERS else "all"
        results = GoldenResult.objects.filter(eval_run=run)
        if shown == "failed":
            results = results.filter(Q(passed=False) | Q(grading_error=True) | ~Q(error=""))
        elif shown == "critical":
            results = results.filter(golden_item__tags__contains=["critical"])
        results = list(results.select_related("golden_item")
                       .defer("reuse_key", "golden_item__metadata", "golden_item__rubric")
                       .order_by("golden_item__position", "golden_item_id")[:RESULT_LIMIT + 1])
        graders = grader_kinds(run.config.get("graders"))
        threshold = run.config.get("threshold")
        can_act = self.has_act_permission(request)
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return {
            "histogram_svg": charts.histogram_svg(score_histogram(run), title=f"Scores of eval run {run.pk}",
                                                  threshold=threshold if isinstance(threshold, int | float) else None),
            "results": [result_view(result, graders) for result in results[:RESULT_LIMIT]],
            "grader_columns": graders, "results_shown": shown,
            "result_filters": [(choice, label) for choice, label in RESULT_FILTERS.items()],
            "results_truncated": len(results) > RESULT_LIMIT, "result_limit": RESULT_LIMIT,
            "results_url": reverse("admin:evals_goldenresult_changelist") + f"?eval_run__id__exact={run.pk}",
            "compare_url": reverse("admin:evals_goldenset_compare", args=[run.golden_set_id]),
            "can_act": can_act,
            "can_cancel": can_act and run.status not in EvalRun.TERMINAL,
            "can_propose": can_act and run.status == EvalRun.Status.COMPLETED,
            "cancel_url": reverse(f"admin:{info}_cancel", args=[quote(run.pk)]),
            "propose_url": reverse(f"admin:{info}_propose", args=[quote(run.pk)]),
        }

    # ---------------------------------------------------------------------------------------- actions

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("<path:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view), name=f"{info}_cancel"),
            path("<path:object_id>/propose/", self.admin_site.admin_view(self.propose_view), name=f"{info}_propose"),
            *super().get_urls(),
        ]

    def _back(self, run):
        return self._change_page(run)

    def cancel_view(self, request, object_id):
        run, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        if eval_run_cancel(eval_run=run, reason=f"cancelled by {request.user} in the admin"):
            self.message_user(request, f"Cancelled eval run {run.pk}.", messages.SUCCESS)
        else:
            self.message_user(request, f"Eval run {run.pk} was not cancelled: it is {run.status} (only queued or "
                                       "running eval runs are cancelled).", messages.ERROR)
        return self._back(run)

    def propose_view(self, request, object_id):
        run, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        if run.status != EvalRun.Status.COMPLETED:
            self.message_user(request, f"No rewrite proposed: eval run {run.pk} is {run.status}; only a completed "
                                       "run's failures are learnt from.", messages.ERROR)
            return self._back(run)
        try:
            proposal = rewriter.propose(eval_run=run, user=request.user)
        except ValueError as exc:  # the rewritten DSL did not validate
            self.message_user(request, f"No rewrite proposed: {exc}", messages.ERROR)
            return self._back(run)
        if proposal.skipped:
            self.message_user(request, f"No rewrite proposed: {proposal.skipped}.", messages.WARNING)
            return self._back(run)
        version = proposal.version
        compare = reverse("admin:evals_goldenset_compare", args=[run.golden_set_id])
        self.message_user(request, format_html(
            '{} <a href="{}">{}</a> (rewrite of node {} by {}, confidence {}): {}. Run an eval of it on '
            '<a href="{}">the golden set</a>, then <a href="{}">compare</a> it with version {}.',
            "Proposed the candidate version" if proposal.created else "The rewrite is the existing version",
            reverse("admin:workflows_workflowversion_change", args=[version.pk]), version.dsl_hash[:12],
            proposal.node_id, proposal.rewriter or "?", f"{proposal.confidence:.2f}", "; ".join(proposal.changelog),
            reverse("admin:evals_goldenset_change", args=[run.golden_set_id]),
            f"{compare}?a={run.workflow_version_id}&b={version.pk}", run.workflow_version.dsl_hash[:12]),
            messages.SUCCESS if proposal.created else messages.INFO)
        return self._back(run)

    def has_cancel_permission(self, request):
        return self.has_act_permission(request)

    @admin.action(description="Cancel selected queued or running eval runs", permissions=["cancel"])
    def cancel_eval_runs(self, request, queryset):
        selected = queryset.count()
        eligible = queryset.exclude(status__in=EvalRun.TERMINAL).order_by("pk")[:500]
        cancelled = sum(1 for run in eligible
                        if eval_run_cancel(eval_run=run, reason=f"cancelled by {request.user} in the admin"))
        self.message_user(request, f"Cancelled {cancelled} of {selected} selected eval runs (only queued or running "
                                   "ones are cancelled; at most 500 at once).", messages.SUCCESS)


RESULT_FILTERS = {"all": "All", "failed": "Failed only", "critical": "Critical only"}


def result_view(result: GoldenResult, graders: list[str] = ()) -> dict:
    """What the eval run's page shows of one item's result (with the score each of `graders` gave it)."""
    item = result.golden_item
    text, full = input_text(item.input), item_text(item.input)
    return {
        "pk": result.pk, "position": item.position, "item": item.pk, "critical": item.critical,
        "url": reverse("admin:evals_goldenresult_change", args=[result.pk]),
        "input": clipped(full), "input_excerpt": excerpt(text, EXCERPT),
        "input_long": len(text) > EXCERPT or full != text,
        "expected": clipped(item.expected_output), "expected_excerpt": excerpt(item.expected_output, EXCERPT),
        "expected_long": len(item.expected_output) > LONG_TEXT,
        "actual": clipped(result.actual_output), "actual_excerpt": excerpt(result.actual_output, EXCERPT),
        "actual_long": len(result.actual_output) > LONG_TEXT,
        "score": score_text(result.score), "passed": result.passed, "grader": result.grader,
        "grades": [_grade_text(result.grades, kind) for kind in graders],
        "rationale": clipped(result.grading_rationale), "rationale_excerpt": excerpt(result.grading_rationale, EXCERPT),
        "rationale_long": len(result.grading_rationale) > EXCERPT,
        "error": result.error, "grading_error": result.grading_error,
        "latency": seconds_text(result.latency_ms / 1000) if result.latency_ms is not None else "-",
        "cost": usd(result.usd_cost),
        "invocation_url": reverse("admin:workflows_workflowinvocation_change", args=[result.workflow_invocation_id])
        if result.workflow_invocation_id else "",
        "invocation": result.workflow_invocation_id,
        "reused": result.reused_from_id is not None, "reused_from": result.reused_from_id,
    }


def grader_kinds(graders) -> list[str]:
    """The kinds of a run's configured graders, once each and in order (what is not a grader with a kind, in
    an older run's config, names no column)."""
    kinds = (entry.get("kind") for entry in graders if isinstance(entry, dict)) if isinstance(graders, list) else ()
    return list(dict.fromkeys(kind for kind in kinds if isinstance(kind, str) and kind))


def _grade_text(grades, kind: str) -> str:
    """The score the first grade of `kind` gave ("error" for a grading error, "-" when none graded)."""
    for grade in grades if isinstance(grades, list) else ():
        if isinstance(grade, dict) and grade.get("kind") == kind:
            if grade.get("error"):
                return "error"
            score = grade.get("score")
            return score_text(score) if isinstance(score, int | float) and not isinstance(score, bool) else "-"
    return "-"


# ------------------------------------------------------------------------------ results and promotions

@admin.register(GoldenResult)
class GoldenResultAdmin(NamedObjectMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    """Results are append-only: no add, change or delete."""

    workspace_field = "eval_run__workspace"
    list_display = ("id", "eval_run_link", "item_display", "score_text", "passed", "grader", "reused", "latency",
                    "usd_cost_text", "created_at")
    list_filter = ("passed", "grading_error")
    list_select_related = ("golden_item",)
    search_fields = ("=grader",)  # see get_search_results
    search_help_text = "An eval run id (its results, in item order) or a grader."
    ordering = ("-eval_run_id", "golden_item__position", "golden_item_id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    change_form_template = "admin/evals/change_form.html"
    fields = ("eval_run_link", "item_display", "version_link", "invocation_link", "score_text", "passed", "grader",
              "grading_error", "error", "actual_pretty", "grading_rationale", "grades_pretty", "latency",
              "usd_cost_text", "judge_usd_text", "reused", "reuse_key", "created_at")
    readonly_fields = fields
    score_text = number_field("score", "score")
    usd_cost_text = number_field("usd_cost", "usd", "USD cost")
    judge_usd_text = number_field("judge_usd", "usd", "judge USD")

    def object_name(self, result) -> str:
        return f"{excerpt(input_text(result.golden_item.input), 60)} · score {score_text(result.score)}"

    def get_queryset(self, request):
        return super().get_queryset(request).defer("grades", "actual_output", "grading_rationale",
                                                   "golden_item__metadata", "golden_item__rubric")

    def get_object(self, request, object_id, from_field=None):
        queryset = GoldenResult.objects.select_related("golden_item", "workflow_version") \
            .defer(*slim_version("workflow_version__"))
        return full_object(self, request, queryset, object_id)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit() and term.isascii():
            return queryset.filter(Q(eval_run_id=int(term)) | Q(grader=term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="eval run", ordering="eval_run_id")
    def eval_run_link(self, result):
        return admin_link("evals_evalrun", result.eval_run_id, result.eval_run_id)

    @admin.display(description="item")
    def item_display(self, result):
        return f"#{result.golden_item.position} {excerpt(input_text(result.golden_item.input), EXCERPT)}"

    @admin.display(description="version")
    def version_link(self, result):
        return admin_link("workflows_workflowversion", result.workflow_version_id,
                          result.workflow_version.dsl_hash[:12])

    @admin.display(description="invocation")
    def invocation_link(self, result):
        return admin_link("workflows_workflowinvocation", result.workflow_invocation_id,
                          result.workflow_invocation_id)

    @admin.display(description="reused")
    def reused(self, result):
        if result.reused_from_id is None:
            return "-"
        return format_html('<span class="ev-reused">reused</span> from {}',
                           admin_link("evals_goldenresult", result.reused_from_id, f"#{result.reused_from_id}"))

    @admin.display(description="latency", ordering="latency_ms")
    def latency(self, result):
        return seconds_text(result.latency_ms / 1000) if result.latency_ms is not None else "-"

    @admin.display(description="actual output")
    def actual_pretty(self, result):
        return format_html('<pre class="wf-json">{}</pre>', clipped(result.actual_output)) \
            if result.actual_output else "-"

    @admin.display(description="grades")
    def grades_pretty(self, result):
        return json_html(result.grades)


@admin.register(Promotion)
class PromotionAdmin(NamedObjectMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    """Activations and rollbacks with the evidence they were decided on: history, read-only."""

    workspace_field = "workflow__workspace"
    list_display = ("id", "action", "workflow", "version_link", "previous_link", "golden_set", "verdict_display",
                    "decided_by", "created_at")
    list_filter = ("action",)
    list_select_related = ("workflow", "workflow_version", "previous_version", "golden_set", "decided_by")
    search_fields = ("workflow__name",)
    ordering = ("-created_at", "-id")
    change_form_template = "admin/evals/change_form.html"
    fields = ("action", "workflow", "version_link", "previous_link", "golden_set_link", "decided_by", "created_at",
              "verdict_display", "evidence_pretty")
    readonly_fields = fields

    def object_name(self, promotion) -> str:
        return f"{promotion.get_action_display()} {version_label(promotion.workflow_version)} of {promotion.workflow}"

    def get_queryset(self, request):
        return super().get_queryset(request).defer(
            "evidence", "golden_set__graders", "golden_set__description", *slim_version("workflow_version__"),
            *slim_version("previous_version__")).annotate(
            verdict=KT("evidence__comparison__verdict"), p_value=KT("evidence__comparison__p_value"),
            mean_diff=KT("evidence__comparison__mean_diff"), first=KT("evidence__first_version"))

    def get_object(self, request, object_id, from_field=None):
        queryset = Promotion.objects.select_related("workflow", "workflow_version", "previous_version", "golden_set",
                                                    "decided_by").defer(*slim_version("workflow_version__"),
                                                                        *slim_version("previous_version__"))
        return full_object(self, request, queryset, object_id)

    @admin.display(description="version")
    def version_link(self, promotion):
        return admin_link("workflows_workflowversion", promotion.workflow_version_id,
                          promotion.workflow_version.dsl_hash[:12])

    @admin.display(description="previous version")
    def previous_link(self, promotion):
        if promotion.previous_version_id is None:
            return "-"
        return admin_link("workflows_workflowversion", promotion.previous_version_id,
                          promotion.previous_version.dsl_hash[:12])

    @admin.display(description="golden set")
    def golden_set_link(self, promotion):
        if promotion.golden_set_id is None:
            return "-"
        return admin_link("evals_goldenset", promotion.golden_set_id, promotion.golden_set.name)

    @admin.display(description="evidence")
    def verdict_display(self, promotion):
        if promotion.action == Promotion.Action.ROLLBACK:
            return "rollback"
        if hasattr(promotion, "verdict"):
            verdict, p_value, diff, first = promotion.verdict, promotion.p_value, promotion.mean_diff, promotion.first
        else:
            comparison = (promotion.evidence or {}).get("comparison") or {}
            verdict, p_value, diff = comparison.get("verdict"), comparison.get("p_value"), comparison.get("mean_diff")
            first = (promotion.evidence or {}).get("first_version")
        if first in (True, "true"):
            return "first active version"
        if verdict is None:
            return "-"
        return f"{verdict}, mean difference {signed_text(_float(diff))}, p = {p_text(_float(p_value))}"

    @admin.display(description="evidence (JSON)")
    def evidence_pretty(self, promotion):
        return format_html('<pre class="wf-json wf-json-full">{}</pre>', pretty_json(promotion.evidence))


def _float(value) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None

