"""The golden set admin's own pages, beside its change page: run an eval, import items, compare two
versions, promote, roll back (`GoldenSetViews`, mixed into `GoldenSetAdmin`; URLs `admin:evals_goldenset_<name>`),
and the forms and phrases they share with the change page.

Every POST view refuses GET (405), is CSRF-protected (`admin_view`), treats another workspace's golden set as a
missing one (as the change page does), and needs the golden set's change permission.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from config.display import diff_lines, excerpt
from config.display import score as score_text
from evals import charts, importing
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet
from evals.services import (
    EvalError,
    PromotionRefused,
    compare_versions,
    eval_run_start,
    golden_items_import,
    version_promote,
    version_rollback,
)
from workflows.execution import input_text
from workflows.models import Workflow, WorkflowVersion
from workflows.selectors import rollback_target, version_diff

VERSION_CHOICES = 200  # versions offered to run or compare
EXCERPT = 120  # inputs and rationales longer than an excerpt start collapsed
VERSION_BIG_COLUMNS = ("dsl", "input_schema", "output_schema", "unresolved_tools")


def slim_version(prefix: str = "") -> list[str]:
    return [f"{prefix}{column}" for column in VERSION_BIG_COLUMNS]


def full_runs(runs):
    """Runs over the whole set: a minibatch run (evolution's first look at a candidate) scores only some items."""
    return runs.exclude(config__has_key="item_ids")


def _errors_text(errors: dict[str, list[str]]) -> str:
    return "; ".join(f"{field}: {message}" for field, problems in errors.items() for message in problems)


def offer_versions(field: forms.ModelChoiceField, versions, offered: list, label, *, blank: bool) -> None:
    """Validate against every version of `versions` but offer only `offered` (the first VERSION_CHOICES:
    evolution writes thousands of versions, and the select lists them from a list read once)."""
    field.queryset = versions
    field.choices = [("", "---------")] * blank + [(v.pk, label(v)) for v in offered]


def run_choice_label(version: WorkflowVersion) -> str:
    return (f"{version.dsl_hash[:12]} · {version.get_status_display()}"
            + (f" · {excerpt(version.commit_message, 60)}" if version.commit_message else ""))


def compare_choice_label(version: WorkflowVersion) -> str:
    runs = version.set_runs
    return (f"{version.dsl_hash[:12]} · {version.get_status_display()} · score {score_text(version.set_score)} "
            f"({runs} run{'s' if runs != 1 else ''})")


class RunForm(forms.Form):
    version = forms.ModelChoiceField(queryset=WorkflowVersion.objects.none(), empty_label=None)
    reuse = forms.BooleanField(required=False, initial=True, label="reuse earlier results",
                               help_text="Results of the same version, item contents and graders are reused.")

    def __init__(self, *args, versions, offered: list | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        offer_versions(self.fields["version"], versions, offered or [], run_choice_label, blank=False)


class ImportForm(forms.Form):
    file = forms.FileField(help_text=f"JSON Lines (.jsonl) or CSV (.csv), UTF-8, at most "
                                     f"{importing.MAX_BYTES // (1024 * 1024)} MB.")
    format = forms.ChoiceField(choices=[("auto", "from the file name"), ("jsonl", "JSON Lines"), ("csv", "CSV")],
                               initial="auto")


class CompareForm(forms.Form):
    a = forms.ModelChoiceField(queryset=WorkflowVersion.objects.none(), label="version a")
    b = forms.ModelChoiceField(queryset=WorkflowVersion.objects.none(), label="version b")

    def __init__(self, *args, versions, offered: list, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("a", "b"):
            offer_versions(self.fields[name], versions, offered, compare_choice_label, blank=True)

    def clean(self):
        data = super().clean()
        if data.get("a") is not None and data.get("a") == data.get("b"):
            raise ValidationError("Choose two different versions.")
        return data


IMPORT_ERRORS_SHOWN = 200  # bad lines listed on the import page


class GoldenSetViews:
    """Run, import, compare, promote and rollback of a golden set (mixed into `GoldenSetAdmin`, whose
    `get_object`, `run_versions` and permissions they use)."""

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        views = (("run", self.run_view), ("import", self.import_view), ("compare", self.compare_view),
                 ("promote", self.promote_view), ("rollback", self.rollback_view))
        return [*(path(f"<path:object_id>/{name}/", self.admin_site.admin_view(view), name=f"{info}_{name}")
                  for name, view in views), *super().get_urls()]

    def _golden_set(self, request, object_id, *, act: bool):
        """The golden set a view works on, or the response that refuses it (a missing or foreign set is
        missing, as on the change page)."""
        golden_set = self.get_object(request, unquote(object_id))
        if golden_set is None:
            return None, self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_permission(request, golden_set) or (
                act and not self.has_change_permission(request, golden_set)):
            raise PermissionDenied
        return golden_set, None

    def _back(self, golden_set, name: str = "change", query: str = ""):
        url = reverse(f"admin:evals_goldenset_{name}", args=[quote(golden_set.pk)])
        return HttpResponseRedirect(url + query)

    def run_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        golden_set, refused = self._golden_set(request, object_id, act=True)
        if refused is not None:
            return refused
        form = RunForm(request.POST, versions=self.run_versions(golden_set))
        if not form.is_valid():
            problem = ("the set has no workflow: choose one and save first" if golden_set.workflow_id is None
                       else _errors_text(form.errors))
            self.message_user(request, f"Not started: {problem}", messages.ERROR)
            return self._back(golden_set)
        version = form.cleaned_data["version"]
        try:
            run = eval_run_start(golden_set=golden_set, version=version, user=request.user,
                                 reuse=form.cleaned_data["reuse"])
        except EvalError as exc:
            self.message_user(request, f"Not started: {exc}", messages.ERROR)
            return self._back(golden_set)
        self.message_user(request, format_html(
            "Started eval run {} of {} on {}; its page shows the progress.",
            run.pk, version.dsl_hash[:12], golden_set.name), messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:evals_evalrun_change", args=[run.pk]))

    def import_view(self, request, object_id):
        golden_set, refused = self._golden_set(request, object_id, act=True)
        if refused is not None:
            return refused
        errors: list[str] = []
        if request.method == "POST":
            form = ImportForm(request.POST, request.FILES)
            if form.is_valid():
                upload, chosen = form.cleaned_data["file"], form.cleaned_data["format"]
                kind = chosen if chosen != "auto" else importing.file_kind(upload.name, upload.content_type)
                try:
                    lines = importing.read_file(importing.read_upload(upload), kind=kind)
                    added, bad = golden_items_import(golden_set=golden_set, items=lines)
                except (importing.Unreadable, EvalError) as exc:
                    errors = [str(exc)]
                else:
                    if added:
                        self.message_user(request, f"Imported {len(added)} item(s) into {golden_set.name} "
                                                   f"(positions {added[0].position} to {added[-1].position}).",
                                          messages.SUCCESS)
                        return self._back(golden_set)
                    errors = [importing.line_text(entry) for entry in bad]
        else:
            form = ImportForm()
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "original": golden_set,
            "title": f"Import items into {golden_set.name}", "form": form,
            "errors": errors[:IMPORT_ERRORS_SHOWN], "errors_hidden": max(0, len(errors) - IMPORT_ERRORS_SHOWN),
            "error_count": len(errors), "fields": importing.ITEM_KEYS, "max_items": importing.MAX_ITEMS,
        }
        return TemplateResponse(request, "admin/evals/goldenset/import.html", context)

    # ------------------------------------------------------------------------------- compare, promote

    def compare_versions_qs(self, golden_set: GoldenSet):
        """Versions with a completed eval run on the set (of the set's workflow when it has one), with
        their latest completed run's score on it."""
        completed = full_runs(EvalRun.objects.filter(golden_set=golden_set, status=EvalRun.Status.COMPLETED))
        latest = completed.filter(workflow_version=OuterRef("pk")).order_by("-ended_at", "-pk")
        runs = completed.filter(workflow_version=OuterRef("pk")).order_by().values("workflow_version") \
            .annotate(n=Count("pk")).values("n")
        versions = WorkflowVersion.objects.filter(pk__in=completed.values("workflow_version"))
        if golden_set.workflow_id is not None:
            versions = versions.filter(workflow_id=golden_set.workflow_id)
        return versions.select_related("workflow").defer(*slim_version()).annotate(
            set_score=Subquery(latest.values("avg_score")[:1]),
            set_runs=Coalesce(Subquery(runs, output_field=IntegerField()), 0)).order_by("-created_at", "-pk")

    def compare_view(self, request, object_id):
        golden_set, refused = self._golden_set(request, object_id, act=False)
        if refused is not None:
            return refused
        versions = self.compare_versions_qs(golden_set)
        choices = list(versions[:VERSION_CHOICES])
        data = request.GET if ("a" in request.GET or "b" in request.GET) else None
        if data is None and len(choices) >= 2:
            # by default the active version (or the oldest) against the best other one (the newest of equals)
            a = next((v for v in choices if v.status == WorkflowVersion.Status.ACTIVE), choices[-1])
            b = max((v for v in choices if v.pk != a.pk), key=lambda v: v.set_score if v.set_score is not None else -1)
            data = {"a": a.pk, "b": b.pk}
        form = CompareForm(data, versions=versions, offered=choices)
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "original": golden_set,
            "title": f"Compare versions on {golden_set.name}", "form": form, "choices": len(choices),
            "change_url": reverse("admin:evals_goldenset_change", args=[quote(golden_set.pk)]),
        }
        if data is not None and form.is_valid():
            context.update(self.comparison_context(request, golden_set, form.cleaned_data["a"],
                                                   form.cleaned_data["b"]))
        return TemplateResponse(request, "admin/evals/goldenset/compare.html", context)

    def comparison_context(self, request, golden_set: GoldenSet, a: WorkflowVersion, b: WorkflowVersion) -> dict:
        try:
            evidence = compare_versions(golden_set=golden_set, version_a=a, version_b=b)
        except EvalError as exc:
            return {"compare_error": str(exc)}
        items = {item.pk: item for item in GoldenItem.objects.filter(golden_set=golden_set)
                 .only("pk", "position", "input", "expected_output", "tags")}
        regressed = {row["item"] for row in evidence["critical_regressions"]}
        outputs = {(run_id, item_id): text for run_id, item_id, text in GoldenResult.objects.filter(
            eval_run_id__in=[evidence["eval_run_a"], evidence["eval_run_b"]])
            .values_list("eval_run_id", "golden_item_id", "actual_output")}
        rows = []
        for entry in evidence["items"]:
            item = items.get(entry["item"])
            text = input_text(item.input) if item else ""
            diff = entry["b"] - entry["a"] if entry["a"] is not None and entry["b"] is not None else None
            rows.append({
                "item": entry["item"], "position": item.position if item else "", "input": excerpt(text, EXCERPT),
                "expected": excerpt(item.expected_output, EXCERPT) if item else "", "critical": entry["critical"],
                "a": score_text(entry["a"]), "b": score_text(entry["b"]),
                "diff": "-" if diff is None else f"{diff:+.3f}",
                "direction": "" if diff is None else "up" if diff > 0 else "down" if diff < 0 else "same",
                "regression": entry["item"] in regressed, "paired": diff is not None,
                "output_a": output_view(outputs.get((evidence["eval_run_a"], entry["item"]))),
                "output_b": output_view(outputs.get((evidence["eval_run_b"], entry["item"]))),
            })
            rows[-1]["outputs"] = [(rows[-1]["output_a"], "a"), (rows[-1]["output_b"], "b")]
        comparison = evidence["comparison"]
        changes = version_diff(a, b)
        chart = charts.paired_svg(
            [{"label": f"#{row['position']} {row['input']}", "a": entry["a"], "b": entry["b"],
              "critical_regression": row["regression"]} for row, entry in zip(rows, evidence["items"], strict=True)],
            label_a=f"a · {a.dsl_hash[:12]}", label_b=f"b · {b.dsl_hash[:12]}",
            mean_a=comparison["mean_a"], mean_b=comparison["mean_b"])
        workflow_id = golden_set.workflow_id or b.workflow_id
        active = WorkflowVersion.objects.filter(workflow_id=workflow_id, status=WorkflowVersion.Status.ACTIVE) \
            .only("pk", "dsl_hash", "status", "workflow_id").first()
        rollback_to = rollback_target(workflow_id=workflow_id)
        can_act = self.has_change_permission(request, golden_set)
        info = "admin:evals_goldenset"
        return {
            "evidence": evidence, "comparison": comparison, "rows": rows, "chart_svg": chart,
            "version_diff": changes, "node_changes": node_changes(changes),
            "stats": {"mean_a": score_text(comparison["mean_a"]), "mean_b": score_text(comparison["mean_b"]),
                      "mean_diff": signed_text(comparison["mean_diff"]), "p": p_text(comparison["p_value"]),
                      "ci": f"{signed_text(comparison['ci_low'])} to {signed_text(comparison['ci_high'])}"},
            "workflow_name": (golden_set.workflow or b.workflow).name,
            "version_a": a, "version_b": b, "unpaired": sum(1 for row in rows if not row["paired"]),
            "critical_regressions": [row for row in rows if row["regression"]],
            "run_a_url": reverse("admin:evals_evalrun_change", args=[evidence["eval_run_a"]]),
            "run_b_url": reverse("admin:evals_evalrun_change", args=[evidence["eval_run_b"]]),
            "version_a_url": reverse("admin:workflows_workflowversion_change", args=[a.pk]),
            "version_b_url": reverse("admin:workflows_workflowversion_change", args=[b.pk]),
            "active_version": active, "a_is_active": active is not None and active.pk == a.pk,
            "rollback_to": rollback_to, "can_act": can_act,
            "can_promote": can_act and b.status != WorkflowVersion.Status.ACTIVE,
            "can_rollback": can_act and rollback_to is not None,
            "promote_url": reverse(f"{info}_promote", args=[quote(golden_set.pk)]),
            "rollback_url": reverse(f"{info}_rollback", args=[quote(golden_set.pk)]),
        }

    def _posted_version(self, request, golden_set: GoldenSet) -> WorkflowVersion | None:
        """The version a promote or rollback form names: of the set's workspace (and workflow, when the set
        has one); None otherwise."""
        value = request.POST.get("version", "")
        if not (value.isdigit() and value.isascii()):
            return None
        versions = WorkflowVersion.objects.filter(pk=int(value), workflow__workspace_id=golden_set.workspace_id)
        if golden_set.workflow_id is not None:
            versions = versions.filter(workflow_id=golden_set.workflow_id)
        return versions.select_related("workflow").defer(*slim_version()).first()

    def _back_to_compare(self, request, golden_set, a=None, b=None):
        a = a if a is not None else request.POST.get("a", "")
        b = b if b is not None else request.POST.get("b", "")
        query = f"?a={a}&b={b}" if str(a).isdigit() and str(b).isdigit() else ""
        return self._back(golden_set, "compare", query)

    def promote_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        golden_set, refused = self._golden_set(request, object_id, act=True)
        if refused is not None:
            return refused
        candidate = self._posted_version(request, golden_set)
        if candidate is None:
            self.message_user(request, "Not promoted: choose a version of this set's workflow.", messages.ERROR)
            return self._back_to_compare(request, golden_set)
        previous = WorkflowVersion.objects.filter(workflow_id=candidate.workflow_id,
                                                  status=WorkflowVersion.Status.ACTIVE).only("pk").first()
        try:
            promotion = version_promote(candidate=candidate, golden_set=golden_set, user=request.user)
        except PromotionRefused as exc:
            self.message_user(request, f"Not promoted: {exc.errors['promotion'][0]}. "
                                       f"{evidence_summary(exc.evidence)}", messages.ERROR)
            # the page of the comparison the refusal was decided on: the active version against the candidate
            return self._back_to_compare(request, golden_set, exc.evidence.get("version_a"), candidate.pk)
        except EvalError as exc:
            self.message_user(request, f"Not promoted: {exc}", messages.ERROR)
            return self._back_to_compare(request, golden_set)
        self.message_user(request, format_html(
            "Promoted {} to the active version of {} ({}). {} <a href=\"{}\">The promotion and its evidence</a>.",
            candidate.dsl_hash[:12], candidate.workflow.name,
            f"it replaces {previous_label(previous)}" if previous else "it is the first active version",
            evidence_summary(promotion.evidence), reverse("admin:evals_promotion_change", args=[promotion.pk])),
            messages.SUCCESS)
        return self._back_to_compare(request, golden_set)

    def rollback_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        golden_set, refused = self._golden_set(request, object_id, act=True)
        if refused is not None:
            return refused
        workflow = Workflow.objects.filter(pk=golden_set.workflow_id).first() if golden_set.workflow_id else None
        if workflow is None:
            version = self._posted_version(request, golden_set)
            workflow = version.workflow if version is not None else None
        if workflow is None:
            self.message_user(request, "Not rolled back: the set has no workflow.", messages.ERROR)
            return self._back_to_compare(request, golden_set)
        try:
            promotion = version_rollback(workflow=workflow, user=request.user)
        except EvalError as exc:
            self.message_user(request, f"Not rolled back: {exc}", messages.ERROR)
            return self._back_to_compare(request, golden_set)
        restored = WorkflowVersion.objects.filter(
            pk__in=[promotion.workflow_version_id, promotion.previous_version_id]).only("pk", "dsl_hash")
        labels = {v.pk: v.dsl_hash[:12] for v in restored}
        self.message_user(request, format_html(
            "Rolled back {}: {} is the active version again (it replaces {}). <a href=\"{}\">The rollback</a>.",
            workflow.name, labels.get(promotion.workflow_version_id, "?"),
            labels.get(promotion.previous_version_id, "no active version"),
            reverse("admin:evals_promotion_change", args=[promotion.pk])), messages.SUCCESS)
        return self._back_to_compare(request, golden_set)


def output_view(text: str | None) -> dict:
    """An item's answer on the compare page: collapsed past an excerpt (None: that side has no result)."""
    text = text or ""
    return {"text": text, "excerpt": excerpt(text, EXCERPT), "long": len(text) > EXCERPT}


def node_changes(changes: dict) -> list[dict]:
    """The nodes that differ between the compared versions: how, which fields, their prompt's diff."""
    return [{"node": node_id, "change": change["change"], "fields": change.get("fields", []),
             "lines": diff_lines(change.get("prompt_diff", []), prefix="ev")}
            for node_id, change in changes["nodes"].items() if change["change"] != "same"]


def previous_label(version) -> str:
    return f"version {version.dsl_hash[:12]}" if getattr(version, "dsl_hash", None) else f"version {version.pk}"


def evidence_summary(evidence: dict) -> str:
    """One sentence of a promotion's evidence: the test's numbers and the critical regressions."""
    if not isinstance(evidence, dict):
        return ""
    if evidence.get("first_version"):
        return (f"Evidence: no active version to compare with; its eval run {evidence.get('eval_run')} scored "
                f"{score_text(evidence.get('avg_score'))}.")
    comparison = evidence.get("comparison") or {}
    if not comparison:
        return ""
    text = (f"Evidence: {comparison.get('verdict')} on {comparison.get('n')} paired items, mean difference "
            f"{signed_text(comparison.get('mean_diff'))} (95% interval {signed_text(comparison.get('ci_low'))} to "
            f"{signed_text(comparison.get('ci_high'))}), p = {p_text(comparison.get('p_value'))}, "
            f"alpha {comparison.get('alpha')}.")
    regressions = evidence.get("critical_regressions") or []
    if regressions:
        text += " Critical items that regressed: " + ", ".join(
            f"item {row['item']} ({score_text(row['a'])} → {score_text(row['b'])})" for row in regressions[:10]) + "."
    return text


def signed_text(value) -> str:
    return "-" if value is None else f"{value:+.3f}"


def p_text(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if value >= 0.0001 else f"{value:.1e}"
