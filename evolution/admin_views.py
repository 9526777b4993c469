"""The evolution run admin's own pages, beside its run page: Start evolution, and Pause / Resume / Cancel /
Promote best on a run (`EvolutionRunViews`, mixed into `EvolutionRunAdmin`; URLs
`admin:evolution_evolutionrun_<name>`), with the links and phrases they share with the run page.

Every POST view refuses GET (405), is CSRF-protected (`admin_view`), treats another workspace's run as a missing
one (as the run page does) and needs the evolution run's change permission; so does the Start evolution page.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html

from evals.models import GoldenSet
from evals.services import EvalError, PromotionRefused
from evolution.conf import DEFAULTS
from evolution.models import EvolutionRun
from evolution.services import (
    EvolutionError,
    evolution_cancel,
    evolution_pause,
    evolution_promote_best,
    evolution_resume,
    evolution_start,
)
from workflows.models import Workflow
from workspaces.admin_scope import workspaces_for


def admin_url(name: str, pk) -> str | None:
    """An admin change page's URL; None when that admin is not registered (a link then shows as text)."""
    try:
        return reverse(f"admin:{name}_change", args=[quote(pk)])
    except NoReverseMatch:
        return None


def admin_link(name: str, pk, label):
    if pk is None:
        return "-"
    url = admin_url(name, pk)
    return format_html('<a href="{}">{}</a>', url, label) if url else format_html("{}", label)


def fitness_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def p_text(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if value >= 0.0001 else f"{value:.1e}"


def evidence_text(evidence) -> str:
    """One sentence of a promotion's evidence: the verdict, the p-value and what they were measured on."""
    if not isinstance(evidence, dict):
        return ""
    if evidence.get("first_version"):
        return (f"Evidence: no active version to compare with; activated on its eval run {evidence.get('eval_run')} "
                f"(average score {fitness_text(evidence.get('avg_score'))}).")
    comparison = evidence.get("comparison") or {}
    if not comparison:
        return ""
    diff = comparison.get("mean_diff")
    where = " of the test split" if evidence.get("item_ids") else ""
    text = (f"Evidence: verdict {comparison.get('verdict')}, p = {p_text(comparison.get('p_value'))} "
            f"(alpha {comparison.get('alpha')}), mean difference {'-' if diff is None else f'{diff:+.3f}'} "
            f"on {comparison.get('n')} paired items{where} against the active version.")
    regressions = evidence.get("critical_regressions") or []
    if regressions:
        text += f" {len(regressions)} critical item(s) regressed: " + ", ".join(
            f"item {row.get('item')} ({fitness_text(row.get('a'))} → {fitness_text(row.get('b'))})"
            for row in regressions[:10]) + "."
    return text


class StartForm(forms.Form):
    workflow = forms.ModelChoiceField(queryset=Workflow.objects.none(),
                                      help_text="The workflow to improve; its active version is the base "
                                                "(else its newest version no evolution bred).")
    golden_set = forms.ModelChoiceField(queryset=GoldenSet.objects.none(), label="Golden set",
                                        help_text="The items each individual is scored on: a set of the "
                                                  "workflow's workspace.")
    mode = forms.ChoiceField(choices=EvolutionRun.Mode.choices, initial=EvolutionRun.Mode.GP)
    population = forms.IntegerField(initial=DEFAULTS["population"],
                                    help_text="Individuals kept per generation (2 to 100).")
    generations = forms.IntegerField(initial=DEFAULTS["generations"], help_text="At most this many (1 to 200).")
    seed = forms.IntegerField(initial=DEFAULTS["seed"],
                              help_text="The same seed on the same workflow and set makes the same run.")
    goal = forms.CharField(required=False, max_length=10_000, widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
                           help_text="Optional: what to improve, in words (material for the mutations).")

    # where evolution_start's error keys are shown
    FIELDS = {"workflow": "workflow", "golden_set": "golden_set", "mode": "mode", "goal": "goal",
              "config.population": "population", "config.generations": "generations", "config.seed": "seed"}

    def __init__(self, *args, request, **kwargs):
        super().__init__(*args, **kwargs)
        workspaces = workspaces_for(request)
        self.fields["workflow"].queryset = Workflow.objects.filter(workspace__in=workspaces) \
            .select_related("workspace").defer("description").order_by("workspace__name", "name", "pk")
        self.fields["golden_set"].queryset = GoldenSet.objects.filter(workspace__in=workspaces) \
            .select_related("workspace").only("pk", "name", "workspace__name").order_by("workspace__name", "name", "pk")
        for name in ("workflow", "golden_set"):
            self.fields[name].label_from_instance = lambda row: f"{row.workspace.name} · {row.name}"

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        for key, problems in errors.items():
            for problem in problems:
                name = self.FIELDS.get(key)
                self.add_error(name, problem if name else f"{key}: {problem}")


class EvolutionRunViews:
    """Start, pause, resume, cancel and promote-best (mixed into `EvolutionRunAdmin`, whose `_acting_on`,
    `_change_page` and `has_act_permission` come from `PostActionsMixin`)."""

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        views = (("pause", self.pause_view), ("resume", self.resume_view), ("cancel", self.cancel_view),
                 ("promote", self.promote_view))
        return [path("start/", self.admin_site.admin_view(self.start_view), name=f"{info}_start"),
                *(path(f"<path:object_id>/{name}/", self.admin_site.admin_view(view), name=f"{info}_{name}")
                  for name, view in views),
                *super().get_urls()]

    def _back(self, run):
        return self._change_page(run)

    def pause_view(self, request, object_id):
        run, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        try:
            evolution_pause(run=run)
        except EvolutionError as exc:
            self.message_user(request, f"Not paused: {exc}.", messages.ERROR)
        else:
            self.message_user(request, f"Evolution run {run.pk} pauses at the next generation boundary (the "
                                       "generation under way finishes first).", messages.SUCCESS)
        return self._back(run)

    def resume_view(self, request, object_id):
        run, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        try:
            evolution_resume(run=run)
        except EvolutionError as exc:
            self.message_user(request, f"Not resumed: {exc}.", messages.ERROR)
        else:
            self.message_user(request, f"Resumed evolution run {run.pk}.", messages.SUCCESS)
        return self._back(run)

    def cancel_view(self, request, object_id):
        run, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        if evolution_cancel(run=run, reason=f"cancelled by {request.user} in the admin"):
            self.message_user(request, f"Cancelled evolution run {run.pk} and its eval runs under way.",
                              messages.SUCCESS)
        else:
            self.message_user(request, f"Evolution run {run.pk} was not cancelled: it is {run.status}.",
                              messages.ERROR)
        return self._back(run)

    def promote_view(self, request, object_id):
        run, refused = self._acting_on(request, object_id)
        if refused is not None:
            return refused
        best = run.best_version
        try:
            promotion = evolution_promote_best(run=run, user=request.user)
        except PromotionRefused as exc:
            self.message_user(request, f"Not promoted: {exc.errors['promotion'][0]}. {evidence_text(exc.evidence)}",
                              messages.ERROR)
            return self._back(run)
        except (EvalError, EvolutionError) as exc:
            self.message_user(request, f"Not promoted: {exc}.", messages.ERROR)
            return self._back(run)
        previous = promotion.previous_version
        self.message_user(request, format_html(
            "Promoted {} (the run's best, fitness {}) to the active version of {} ({}). {} {}",
            best.dsl_hash[:12], fitness_text(run.best_fitness), run.workflow.name,
            f"it replaces version {previous.dsl_hash[:12]}" if previous else "it is the first active version",
            evidence_text(promotion.evidence), admin_link("evals_promotion", promotion.pk, "The promotion and its "
                                                                                          "evidence.")),
            messages.SUCCESS)
        return self._back(run)

    def start_view(self, request):
        if not self.has_act_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = StartForm(request.POST, request=request)
            if form.is_valid():
                data = form.cleaned_data
                try:
                    run = evolution_start(
                        workflow=data["workflow"], golden_set=data["golden_set"], mode=data["mode"],
                        config={key: data[key] for key in ("population", "generations", "seed")},
                        goal=data["goal"], user=request.user)
                except EvolutionError as exc:
                    form.add_service_errors(exc.errors)
                else:
                    self.message_user(request, format_html(
                        "Started evolution run {} of {} on {} ({}, population {}, {} generations, seed {}); its "
                        "page shows the progress.", run.pk, run.workflow.name, run.golden_set.name,
                        run.get_mode_display(), data["population"], data["generations"], data["seed"]),
                        messages.SUCCESS)
                    return self._back(run)
        else:
            initial = {key: request.GET[key] for key in ("workflow", "golden_set")
                       if request.GET.get(key, "").isdigit()}
            form = StartForm(initial=initial, request=request)
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": "Start evolution",
                   "form": form, "changelist_url": reverse("admin:evolution_evolutionrun_changelist")}
        return TemplateResponse(request, "admin/evolution/evolutionrun/start.html", context)
