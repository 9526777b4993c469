"""Evolution in the admin, scoped to the staff user's workspaces (superusers see every workspace).

- Evolution runs: a read-only list (workflow, mode, status with facet counts, generations done, best
  fitness, lift over the base, evaluations, rollouts, cost) and a Start evolution page (workflow, a
  golden set of the same workspace, mode, population, generations, seed, goal) calling
  `services.evolution_start`; its refusals are shown on the fields they name.
- The run page (read-only): configuration, counters, stop reason, links to the base and best versions
  and to the durable run; the fitness over generations and the genealogy of the run (both
  server-rendered SVG, evolution/charts.py); the generations with their individuals. Pause / Resume /
  Cancel buttons (each shown only in a status it applies to) and Promote best
  (`services.evolution_promote_best`: the evals lifecycle's paired test against the active version;
  a refusal shows the evidence's verdict and p-value).
- Generations and individuals: read-only lists and pages.

The Start evolution page and the run's POST views are in evolution/admin_views.py; each needs the evolution
run's change permission (the run admin itself stays read-only).
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Case, F, FloatField, Q, When
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from config.admin import EstimatedCountPaginator, PostActionsMixin, ReadOnlyAdmin
from config.display import durable_run_link, excerpt, json_html, moment, status_badge, usd
from config.display import seconds as seconds_text
from evolution import charts
from evolution.admin_views import EvolutionRunViews, admin_link, admin_url, fitness_text, p_text
from evolution.models import EvolutionRun, Generation, Individual
from evolution.selectors import run_genealogy_versions
from workflows.models import Workflow, WorkflowVersion
from workspaces.admin_scope import (
    ScopedChoiceFilter,
    WorkspaceFilter,
    WorkspaceScopedAdmin,
    full_object,
    workspaces_for,
)

INDIVIDUAL_ROWS = 1500  # individuals listed on a run's page; the individuals list pages through the rest
GENEALOGY_LIMIT = 3000  # versions drawn in a run's genealogy
NOTE_EXCERPT = 140
VERSION_BIG_COLUMNS = ("dsl", "input_schema", "output_schema", "unresolved_tools")


def _slim(prefix: str) -> list[str]:
    return [f"{prefix}{column}" for column in VERSION_BIG_COLUMNS]


def version_url(pk) -> str:
    return reverse("admin:workflows_workflowversion_change", args=[quote(pk)])


def signed_text(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def lift_text(lift: float | None) -> str:
    """The relative gain as a percentage: +12.5%."""
    return "-" if lift is None else f"{lift * 100:+.1f}%"


def ancestor_columns(nodes: dict[int, dict]) -> None:
    """Columns for the versions the run did not evaluate (ancestors it reached through its versions'
    parents): one left of their leftmost child, so such a version sits just before the generation that
    bred from it; left of generation 0 it lands in an "earlier" column (a negative number)."""
    children: dict[int, list[int]] = {}
    for key, node in nodes.items():
        for parent in node["parents"]:
            if parent in nodes:
                children.setdefault(parent, []).append(key)

    def column(key: int, seen: set) -> int:
        node = nodes[key]
        if node["column"] is None:
            seen.add(key)  # versions form no cycle; the guard keeps a corrupt row from looping
            below = [column(child, seen) for child in children.get(key, []) if child not in seen]
            node["column"] = (min(below) if below else 0) - 1
        return node["column"]

    for key in [key for key, node in nodes.items() if node["column"] is None]:
        column(key, set())


# --------------------------------------------------------------------------------------- run list

class RunWorkflowFilter(ScopedChoiceFilter):
    title, parameter_name, field = "workflow", "workflow", "workflow_id"

    def options(self, request):
        return Workflow.objects.filter(workspace__in=workspaces_for(request)).order_by("name", "pk") \
            .values_list("pk", "name")


@admin.register(EvolutionRun)
class EvolutionRunAdmin(EvolutionRunViews, PostActionsMixin, WorkspaceScopedAdmin, ReadOnlyAdmin):
    # compact columns, so the list fits a laptop screen beside the filters
    list_display = ("id", "workflow_link", "mode", "progress_display", "best_fitness_display", "lift_display",
                    "work_display", "cost", "created")
    list_display_links = ("id",)
    list_filter = ("status", "mode", RunWorkflowFilter, WorkspaceFilter)
    show_facets = admin.ShowFacets.ALWAYS  # the status counts are the overview an operator comes for
    list_select_related = ("workflow",)
    search_fields = ("id",)  # see get_search_results
    search_help_text = "A run id, a durable run id, or a workflow's name."
    ordering = ("-created_at", "-id")
    list_per_page = 50
    change_form_template = "admin/evolution/evolutionrun/change_form.html"
    fieldsets = (
        (None, {"fields": ("workflow_link", "golden_set_link", "mode", "status_display", "stop_reason_display",
                           "error_pretty", "goal_display", "created_by", "created_at", "started_at", "ended_at",
                           "duration_display", "run_link")}),
        ("Versions", {"fields": ("base_version_link", "best_version_link", "lift_display", "held_out_display")}),
        ("Counters", {"fields": ("generations_display", "evaluations", "rollouts", "cache_hits", "cost_display")}),
        ("Configuration", {"fields": ("config_pretty",)}),
    )
    readonly_fields = ("workflow_link", "golden_set_link", "mode", "status_display", "stop_reason_display",
                       "error_pretty", "goal_display", "created_by", "created_at", "started_at", "ended_at",
                       "duration_display", "run_link", "base_version_link", "best_version_link", "lift_display",
                       "held_out_display", "generations_display", "evaluations", "rollouts", "cache_hits",
                       "cost_display", "config_pretty")

    def get_queryset(self, request):
        # the lift shown is the test split's when the run has one, else the search set's
        return super().get_queryset(request).defer("config", "error", "goal_text", "report",
                                                    "workflow__description").annotate(
            planned=KT("config__generations"), test_lift_value=Cast(KT("report__test__lift"), FloatField()),
            lift_value=Coalesce(
                F("test_lift_value"),
                Case(When(base_fitness__gt=0, then=(F("best_fitness") - F("base_fitness")) / F("base_fitness")),
                     default=None, output_field=FloatField())))

    def get_object(self, request, object_id, from_field=None):
        queryset = EvolutionRun.objects.select_related(
            "workflow", "golden_set", "base_version", "best_version", "created_by").defer(
            "golden_set__graders", "golden_set__description", *_slim("base_version__"), *_slim("best_version__"))
        return full_object(self, request, queryset, object_id)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(durable_run_id=term) | Q(workflow__name__icontains=term)
        if term.isdigit() and term.isascii():
            match |= Q(pk=int(term))
        return queryset.filter(match), False

    # ------------------------------------------------------------------------------ columns and fields

    @admin.display(description="workflow", ordering="workflow__name")
    def workflow_link(self, run):
        return admin_link("workflows_workflow", run.workflow_id, run.workflow.name)

    @admin.display(description="golden set")
    def golden_set_link(self, run):
        return admin_link("evals_goldenset", run.golden_set_id, run.golden_set.name)

    @admin.display(description="status", ordering="status")
    def status_display(self, run):
        badge = status_badge(run.status, run.get_status_display())
        if run.status == EvolutionRun.Status.PAUSED:
            where = f"waiting at boundary {run.paused_at}" if run.paused_at else "pausing at the next generation"
            return format_html('{} <span class="wf-muted">{}</span>', badge, where)
        return badge

    @admin.display(description="generations")
    def generations_display(self, run):
        planned = run.planned if hasattr(run, "planned") else (run.config or {}).get("generations")
        return f"{run.generations_done} / {planned}" if planned not in (None, "") else str(run.generations_done)

    @admin.display(description="status", ordering="status")
    def progress_display(self, run):
        return format_html('{}<br><span class="wf-muted">{} generations</span>', self.status_display(run),
                           self.generations_display(run))

    @admin.display(description="evaluations (rollouts)", ordering="evaluations")
    def work_display(self, run):
        return f"{run.evaluations} ({run.rollouts})"

    @admin.display(description="created", ordering="created_at")
    def created(self, run):
        return moment(run.created_at)

    @admin.display(description="best fitness", ordering="best_fitness")
    def best_fitness_display(self, run):
        return fitness_text(run.best_fitness)

    @admin.display(description="lift", ordering="lift_value")
    def lift_display(self, run):
        listed = hasattr(run, "lift_value")
        on_test = (run.test_lift_value if listed else run.test_lift) is not None
        lift = run.lift_value if listed else (run.test_lift if on_test else run.lift)
        text = lift_text(lift)
        if lift is None:
            return text
        return format_html('<span class="{}">{}</span> <span class="wf-muted evo-lift-on">{}</span>',
                           "evo-up" if lift > 0 else "evo-down" if lift < 0 else "", text,
                           "on test" if on_test else "on the search set")

    @admin.display(description="held-out claim")
    def held_out_display(self, run):
        report = run.report or {}
        if report.get("held_out"):
            counts = report.get("splits") or {}
            return format_html('<span id="evo-held-out">yes</span> <span class="wf-muted">searched on {} train items, '
                               "selected on {} validation items, reported on {} test items</span>",
                               counts.get("train", "-"), counts.get("validation", "-"), counts.get("test", "-"))
        if report.get("held_out") is False:
            return format_html('<span id="evo-held-out">no</span> <span class="wf-muted">searched and selected on the '
                               "whole set: {}</span>", report.get("reason") or "-")
        return "-"

    @admin.display(description="cost", ordering="usd_cost")
    def cost(self, run):
        return usd(run.usd_cost)

    @admin.display(description="cost")
    def cost_display(self, run):
        return f"{usd(run.usd_cost)} ({run.cache_hits} model calls answered from the cache)"

    @admin.display(description="stop reason")
    def stop_reason_display(self, run):
        return run.stop_reason or ("-" if run.status in EvolutionRun.TERMINAL else "still running")

    @admin.display(description="error")
    def error_pretty(self, run):
        return format_html('<pre class="wf-json wf-error">{}</pre>', run.error) if run.error else "-"

    @admin.display(description="goal")
    def goal_display(self, run):
        return run.goal_text or "-"

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

    def _version(self, version, fitness, role: str):
        if version is None:
            return "-"
        return format_html('<a href="{}" id="evo-{}-version">{}</a> <span class="wf-muted">{} · fitness {}</span>',
                           version_url(version.pk), role, version.dsl_hash[:12], version.get_status_display(),
                           fitness_text(fitness))

    @admin.display(description="base version")
    def base_version_link(self, run):
        return self._version(run.base_version, run.base_fitness, "base")

    @admin.display(description="best version")
    def best_version_link(self, run):
        return self._version(run.best_version, run.best_fitness, "best")

    @admin.display(description="configuration")
    def config_pretty(self, run):
        return json_html(run.config)

    # ------------------------------------------------------------------------------------ change page

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "can_start": self.has_act_permission(request),
                         "start_url": reverse("admin:evolution_evolutionrun_start")}
        return super().changelist_view(request, extra_context)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.run_context(request, obj))
            context["subtitle"] = f"Evolution run {obj.pk} of {obj.workflow.name} on {obj.golden_set.name}"
        return super().render_change_form(request, context, add, change, form_url, obj)

    def run_context(self, request, run: EvolutionRun) -> dict:
        generations = list(Generation.objects.filter(evolution_run=run).order_by("number")
                           .values("pk", "number", "stats", "best_workflow_version_id", "started_at", "ended_at"))
        individuals = list(Individual.objects.filter(evolution_run=run).order_by("generation__number", "-fitness", "pk")
                           .values("pk", "generation_id", "workflow_version_id", "eval_run_id", "kind", "note",
                                   "fitness", "survived"))
        versions = {v.pk: v for v in run_genealogy_versions(run)[:GENEALOGY_LIMIT]}
        number_of = {g["pk"]: g["number"] for g in generations}

        # the genealogy: a node per version, in the column of the generation it first took part in
        nodes: dict[int, dict] = {}
        for version in versions.values():
            nodes[version.pk] = {
                "id": version.pk, "column": None, "label": version.dsl_hash[:12], "url": version_url(version.pk),
                "fitness": None, "kind": "", "note": "", "operation": version.operation,
                "parents": [p for p in (version.parent1_id, version.parent2_id) if p],
                "base": version.pk == run.base_version_id, "best": version.pk == run.best_version_id}
        for row in individuals:  # generation order: the first sighting names the column, kind and note
            node = nodes.get(row["workflow_version_id"])
            if node is None:
                continue
            if node["column"] is None:
                node.update(column=number_of.get(row["generation_id"], 0), kind=row["kind"], note=row["note"])
            if row["fitness"] is not None and (node["fitness"] is None or row["fitness"] > node["fitness"]):
                node["fitness"] = row["fitness"]
        ancestor_columns(nodes)

        # the generations table, each generation with its individuals
        by_generation: dict[int, list[dict]] = {}
        for row in individuals[:INDIVIDUAL_ROWS]:
            version = versions.get(row["workflow_version_id"])
            by_generation.setdefault(row["generation_id"], []).append({
                "pk": row["pk"], "version_url": version_url(row["workflow_version_id"]),
                "version": version.dsl_hash[:12] if version else f"#{row['workflow_version_id']}",
                "operation": version.get_operation_display() if version else "",
                "kind": row["kind"], "note": row["note"], "note_excerpt": excerpt(row["note"], NOTE_EXCERPT),
                "note_long": len(row["note"]) > NOTE_EXCERPT, "fitness": fitness_text(row["fitness"]),
                "survived": row["survived"], "base": row["workflow_version_id"] == run.base_version_id,
                "best": row["workflow_version_id"] == run.best_version_id,
                "eval_run_url": admin_url("evals_evalrun", row["eval_run_id"]) if row["eval_run_id"] else None,
                "eval_run": row["eval_run_id"]})
        table, previous = [], {"run_evaluations": 0, "run_rollouts": 0}
        for generation in generations:
            stats = generation["stats"] or {}
            best_id = generation["best_workflow_version_id"]
            table.append({
                "pk": generation["pk"], "number": generation["number"],
                "url": reverse("admin:evolution_generation_change", args=[generation["pk"]]),
                "best": fitness_text(stats.get("best")), "avg": fitness_text(stats.get("avg")),
                "worst": fitness_text(stats.get("worst")), "stddev": fitness_text(stats.get("stddev")),
                "evaluations": _delta(stats, previous, "run_evaluations"),
                "rollouts": _delta(stats, previous, "run_rollouts"),
                "improvement": signed_text(stats.get("improvement")),
                "improved": (stats.get("improvement") or 0) > 0,
                "members": stats.get("members", len(by_generation.get(generation["pk"], []))),
                "best_version": versions[best_id].dsl_hash[:12] if best_id in versions else best_id,
                "best_version_url": version_url(best_id) if best_id else None,
                "duration": seconds_text((generation["ended_at"] - generation["started_at"]).total_seconds())
                if generation["started_at"] and generation["ended_at"] else "-",
                "individuals": by_generation.get(generation["pk"], []),
            })
            previous = stats

        info = f"{self.opts.app_label}_{self.opts.model_name}"
        can_act = self.has_act_permission(request)
        best = run.best_version
        return {
            "fitness_svg": charts.fitness_svg(
                [{"number": g["number"], **{key: (g["stats"] or {}).get(key) for key in ("best", "avg", "worst")}}
                 for g in generations], base_fitness=run.base_fitness, title=f"Fitness of evolution run {run.pk}"),
            "genealogy_svg": charts.genealogy_svg(list(nodes.values()), title=f"Genealogy of evolution run {run.pk}"),
            "genealogy_count": len(nodes), "genealogy_truncated": len(versions) >= GENEALOGY_LIMIT,
            "genealogy_limit": GENEALOGY_LIMIT,
            "generation_rows": table,
            "report": report_context(run),
            "individual_count": len(individuals), "individuals_truncated": len(individuals) > INDIVIDUAL_ROWS,
            "individual_limit": INDIVIDUAL_ROWS,
            "individuals_url": reverse("admin:evolution_individual_changelist") + f"?q={run.pk}",
            "can_act": can_act,
            "can_pause": can_act and run.status in (EvolutionRun.Status.QUEUED, EvolutionRun.Status.RUNNING),
            "can_resume": can_act and run.status == EvolutionRun.Status.PAUSED,
            "can_cancel": can_act and run.status not in EvolutionRun.TERMINAL,
            "can_promote": can_act and best is not None and best.status != WorkflowVersion.Status.ACTIVE,
            "best_is_active": best is not None and best.status == WorkflowVersion.Status.ACTIVE,
            **{f"{name}_url": reverse(f"admin:{info}_{name}", args=[quote(run.pk)])
               for name in ("pause", "resume", "cancel", "promote")},
        }


SPLIT_COLUMNS = {True: (("train", "train"), ("validation", "validation"), ("test", "test")),
                 False: (("whole_set", "whole set"),)}


def report_context(run: EvolutionRun) -> dict | None:
    """The run's generalization result as the page shows it: fitness of base and best on each split it scored
    (or on the whole set without a held-out claim), the test lift with its interval and paired test, the gap."""
    report = run.report or {}
    if not report:
        return None
    held_out = bool(report.get("held_out"))
    columns = SPLIT_COLUMNS[held_out]
    rows = [{"role": role, "version_id": (report.get(role) or {}).get("version_id"),
             "values": [fitness_text((report.get(role) or {}).get(key)) for key, _ in columns]}
            for role in ("base", "best")]
    test = report.get("test") or {}
    comparison = test.get("comparison") or {}
    lift = test.get("lift")
    return {
        "held_out": held_out, "reason": report.get("reason", ""), "splits": report.get("splits") or {},
        "columns": [label for _, label in columns], "rows": rows, "scored": bool(test),
        "lift": lift_text(lift), "lift_class": "" if lift is None else "evo-up" if lift > 0 else "evo-down" if lift < 0
        else "", "lift_low": lift_text(test.get("lift_low")), "lift_high": lift_text(test.get("lift_high")),
        "mean_diff": signed_text(comparison.get("mean_diff")), "ci_low": signed_text(comparison.get("ci_low")),
        "ci_high": signed_text(comparison.get("ci_high")), "p_value": p_text(comparison.get("p_value")),
        "verdict": comparison.get("verdict", "-"), "alpha": comparison.get("alpha"), "paired": test.get("paired"),
        "gap": signed_text(report.get("train_test_gap")), "error": report.get("test_error", ""),
        "ended": run.status in EvolutionRun.TERMINAL,
    }


def _delta(stats: dict, previous: dict, key: str):
    """A running total's growth over the previous generation (the generation's own share)."""
    if stats.get(key) is None:
        return "-"
    return stats[key] - (previous.get(key) or 0)


# ------------------------------------------------------------------------------ generations, individuals

class IndividualInline(admin.TabularInline):
    model = Individual
    fields = ("version_link", "kind", "note", "fitness", "avg_score", "survived", "eval_run_link")
    readonly_fields = fields
    extra = 0
    can_delete = False
    ordering = ("-fitness", "pk")

    def get_queryset(self, request):
        # the generation too: each row's title (str) names it
        return super().get_queryset(request).select_related("workflow_version", "generation") \
            .defer(*_slim("workflow_version__"))

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="version")
    def version_link(self, individual):
        return format_html('<a href="{}">{}</a>', version_url(individual.workflow_version_id),
                           individual.workflow_version.dsl_hash[:12])

    @admin.display(description="eval run")
    def eval_run_link(self, individual):
        return admin_link("evals_evalrun", individual.eval_run_id, individual.eval_run_id)


@admin.register(Generation)
class GenerationAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "evolution_run__workspace"
    list_display = ("__str__", "run_link", "best_display", "avg_display", "worst_display", "stddev_display",
                    "improvement_display", "members", "best_version_link", "ended_at")
    list_select_related = ("evolution_run__workflow", "best_workflow_version")
    search_fields = ("=evolution_run__id",)  # see get_search_results
    search_help_text = "An evolution run id (its generations, in order)."
    ordering = ("-evolution_run_id", "number")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    change_form_template = "admin/evolution/change_form.html"
    fields = ("run_link", "number", "best_display", "avg_display", "worst_display", "stddev_display",
              "improvement_display", "members", "best_version_link", "started_at", "ended_at", "stats_pretty")
    readonly_fields = fields
    inlines = (IndividualInline,)

    def get_queryset(self, request):
        return super().get_queryset(request).defer(
            "evolution_run__config", "evolution_run__error", "evolution_run__goal_text",
            "evolution_run__workflow__description", *_slim("best_workflow_version__"))

    def get_object(self, request, object_id, from_field=None):
        queryset = Generation.objects.select_related("evolution_run__workflow", "best_workflow_version").defer(
            "evolution_run__config", "evolution_run__error", "evolution_run__goal_text",
            "evolution_run__workflow__description", *_slim("best_workflow_version__"))
        return full_object(self, request, queryset, object_id)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit() and term.isascii():
            return queryset.filter(evolution_run_id=int(term)), False
        return (queryset.none(), False) if term else (queryset, False)

    def _stat(self, generation, key):
        return (generation.stats or {}).get(key)

    @admin.display(description="evolution run", ordering="evolution_run_id")
    def run_link(self, generation):
        return admin_link("evolution_evolutionrun", generation.evolution_run_id,
                          f"{generation.evolution_run_id} · {generation.evolution_run.workflow.name}")

    @admin.display(description="best")
    def best_display(self, generation):
        return fitness_text(self._stat(generation, "best"))

    @admin.display(description="average")
    def avg_display(self, generation):
        return fitness_text(self._stat(generation, "avg"))

    @admin.display(description="worst")
    def worst_display(self, generation):
        return fitness_text(self._stat(generation, "worst"))

    @admin.display(description="stddev")
    def stddev_display(self, generation):
        return fitness_text(self._stat(generation, "stddev"))

    @admin.display(description="improvement")
    def improvement_display(self, generation):
        return signed_text(self._stat(generation, "improvement"))

    @admin.display(description="members")
    def members(self, generation):
        return self._stat(generation, "members") or "-"

    @admin.display(description="best version")
    def best_version_link(self, generation):
        version = generation.best_workflow_version
        return format_html('<a href="{}">{}</a>', version_url(version.pk), version.dsl_hash[:12]) if version else "-"

    @admin.display(description="statistics")
    def stats_pretty(self, generation):
        return json_html(generation.stats)


@admin.register(Individual)
class IndividualAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    workspace_field = "evolution_run__workspace"
    list_display = ("id", "run_link", "generation_number", "version_link", "kind", "note_excerpt", "fitness",
                    "survived", "eval_run_link")
    list_filter = ("survived",)
    list_select_related = ("generation", "workflow_version")
    search_fields = ("=kind",)  # see get_search_results
    search_help_text = "An evolution run id (its individuals, generation by generation) or an operator kind."
    ordering = ("-evolution_run_id", "generation__number", "-fitness", "id")
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    list_per_page = 100
    change_form_template = "admin/evolution/change_form.html"
    fields = ("run_link", "generation_link", "version_link", "operation", "kind", "note", "fitness", "avg_score",
              "survived", "eval_run_link")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer(
            "generation__stats", *_slim("workflow_version__"), "workflow_version__commit_message")

    def get_object(self, request, object_id, from_field=None):
        queryset = Individual.objects.select_related("generation", "workflow_version").defer(
            *_slim("workflow_version__"))
        return full_object(self, request, queryset, object_id)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term.isdigit() and term.isascii():
            return queryset.filter(evolution_run_id=int(term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="evolution run", ordering="evolution_run_id")
    def run_link(self, individual):
        return admin_link("evolution_evolutionrun", individual.evolution_run_id, individual.evolution_run_id)

    @admin.display(description="generation", ordering="generation__number")
    def generation_number(self, individual):
        return individual.generation.number

    @admin.display(description="generation")
    def generation_link(self, individual):
        return admin_link("evolution_generation", individual.generation_id, individual.generation.number)

    @admin.display(description="version")
    def version_link(self, individual):
        return format_html('<a href="{}">{}</a>', version_url(individual.workflow_version_id),
                           individual.workflow_version.dsl_hash[:12])

    @admin.display(description="operation")
    def operation(self, individual):
        return individual.workflow_version.get_operation_display()

    @admin.display(description="note")
    def note_excerpt(self, individual):
        return excerpt(individual.note, NOTE_EXCERPT) or "-"

    @admin.display(description="eval run")
    def eval_run_link(self, individual):
        return admin_link("evals_evalrun", individual.eval_run_id, individual.eval_run_id)
