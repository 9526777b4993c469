"""What the evals add to a workflow invocation's admin page (workflows sits below evals and never imports it:
the section is a panel registered in ``config.admin.change_page_panels``):

- Scores: the golden results that graded this invocation (golden set, item, score, passed, each grader's
  score, a link to the eval run), newest first.
- Add to golden set: a form, prefilled from the invocation (its input; its output as the expected output),
  posted to the golden items admin's `from-invocation/` view, which calls ``services.golden_item_add`` and
  returns to the invocation with a message. It needs the add permission on golden items; the set must be
  of the invocation's workspace (any other is not a choice, so it is refused naming `golden_set`).
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from config.display import excerpt, usd
from config.display import score as score_text
from config.forms import JSONTextField
from evals.admin_views import EXCERPT
from evals.importing import value_problem
from evals.models import GoldenResult, GoldenSet
from evals.services import EvalError, golden_item_add
from workflows.execution import input_text
from workflows.models import WorkflowInvocation
from workspaces.admin_scope import workspaces_for

SCORES_SHOWN = 50  # results listed on an invocation's page (an invocation is graded once per eval run using it)
SETS_OFFERED = 200


def invocation_output_text(output) -> str:
    """The expected output an invocation's output suggests: its text, else its JSON."""
    if isinstance(output, dict) and isinstance(output.get("text"), str):
        return output["text"]
    if output is None:
        return ""
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, indent=2)


class TagsField(forms.CharField):
    """Tags as names separated by commas ("critical, refunds")."""

    def to_python(self, value):
        text = super().to_python(value)
        return [tag.strip() for tag in text.split(",") if tag.strip()]

    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, list) else value


class ItemFromInvocationForm(forms.Form):
    golden_set = forms.ModelChoiceField(queryset=GoldenSet.objects.none(), empty_label=None,
                                        help_text="A golden set of the invocation's workspace.")
    input = JSONTextField(widget=forms.Textarea(attrs={"rows": 3}),
                            help_text="The item's input (JSON), from the invocation's input.")
    expected_output = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}),
                                      help_text="From the invocation's output: edit it into the answer you expect.")
    scoring_criteria = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    tags = TagsField(required=False, max_length=500, help_text='Names separated by commas, e.g. "critical".')

    def __init__(self, *args, invocation: WorkflowInvocation, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["golden_set"].queryset = GoldenSet.objects.filter(workspace_id=invocation.workspace_id) \
            .order_by("name", "pk").only("pk", "name")

    def clean_input(self):
        value = self.cleaned_data["input"]
        if problem := value_problem(value):  # what Postgres's jsonb would refuse (NaN, a NUL...) or the graders
            raise forms.ValidationError(problem)
        return value

    @classmethod
    def prefilled(cls, invocation: WorkflowInvocation) -> ItemFromInvocationForm:
        return cls(invocation=invocation, initial={"input": invocation.input,
                                                   "expected_output": invocation_output_text(invocation.output)})


def invocation_evals_panel(request, invocation: WorkflowInvocation) -> dict:
    """The invocation page's evals section: its scores and the add-to-golden-set form (two queries)."""
    results = list(GoldenResult.objects.filter(workflow_invocation=invocation)
                   .select_related("eval_run__golden_set", "golden_item")
                   .only("pk", "score", "passed", "grader", "grades", "error", "grading_error", "usd_cost",
                         "created_at", "reused_from_id", "eval_run__id", "eval_run__golden_set__id",
                         "eval_run__golden_set__name", "golden_item__id", "golden_item__position",
                         "golden_item__input", "golden_item__tags")
                   .order_by("-created_at", "-pk")[:SCORES_SHOWN])
    can_add = request.user.has_perm("evals.add_goldenitem")
    form = ItemFromInvocationForm.prefilled(invocation) if can_add else None
    sets = list(form.fields["golden_set"].queryset[:SETS_OFFERED]) if form is not None else []
    if form is not None:
        form.fields["golden_set"].choices = [(golden_set.pk, golden_set.name) for golden_set in sets]
    return {
        "template": "admin/evals/_invocation_panel.html",
        "scores": [score_view(result) for result in results],
        "scores_truncated": len(results) == SCORES_SHOWN,
        "results_url": reverse("admin:evals_goldenresult_changelist") + f"?workflow_invocation__id__exact="
                                                                        f"{invocation.pk}",
        "can_add": can_add, "form": form, "has_sets": bool(sets),
        "add_url": reverse("admin:evals_goldenitem_from_invocation") + f"?invocation={invocation.pk}",
    }


def score_view(result: GoldenResult) -> dict:
    item, run = result.golden_item, result.eval_run
    grades = [{"kind": str(grade.get("kind", "?")),
               "score": "error" if grade.get("error") else score_text(grade["score"])
               if isinstance(grade.get("score"), int | float) and not isinstance(grade.get("score"), bool) else "-",
               "weight": grade.get("weight")}
              for grade in (result.grades if isinstance(result.grades, list) else []) if isinstance(grade, dict)]
    return {
        "golden_set": run.golden_set.name,
        "golden_set_url": reverse("admin:evals_goldenset_change", args=[quote(run.golden_set.pk)]),
        "item": f"#{item.position} {excerpt(input_text(item.input), EXCERPT)}",
        "item_url": reverse("admin:evals_goldenitem_change", args=[quote(item.pk)]),
        "critical": item.critical, "score": score_text(result.score), "passed": result.passed, "grades": grades,
        "error": result.error, "grading_error": result.grading_error, "reused": result.reused_from_id is not None,
        "run": run.pk, "run_url": reverse("admin:evals_evalrun_change", args=[quote(run.pk)]),
        "result_url": reverse("admin:evals_goldenresult_change", args=[quote(result.pk)]),
        "cost": usd(result.usd_cost), "when": result.created_at,
    }


class ItemFromInvocationViews:
    """The golden items admin's `from-invocation/?invocation=<id>` page (mixed into GoldenItemAdmin)."""

    def get_urls(self):
        return [path("from-invocation/", self.admin_site.admin_view(self.from_invocation_view),
                     name="evals_goldenitem_from_invocation"), *super().get_urls()]

    def from_invocation_view(self, request):
        if not request.user.has_perm("evals.add_goldenitem"):
            raise PermissionDenied
        pk = request.GET.get("invocation", "")
        invocation = WorkflowInvocation.objects.filter(pk=int(pk), workspace__in=workspaces_for(request)).first() \
            if pk.isascii() and pk.isdigit() else None
        if invocation is None:  # missing, malformed or of another workspace: all read the same
            self.message_user(request, "No such invocation to add to a golden set.", messages.ERROR)
            return HttpResponseRedirect(reverse("admin:workflows_workflowinvocation_changelist"))
        back = reverse("admin:workflows_workflowinvocation_change", args=[quote(invocation.pk)])
        if request.method != "POST":
            form = ItemFromInvocationForm.prefilled(invocation)
        else:
            form = ItemFromInvocationForm(request.POST, invocation=invocation)
            if form.is_valid():
                data = form.cleaned_data
                try:
                    item = golden_item_add(golden_set=data["golden_set"], input=data["input"],
                                           expected_output=data["expected_output"],
                                           scoring_criteria=data["scoring_criteria"], tags=data["tags"],
                                           metadata={"from_invocation": invocation.pk})
                except EvalError as exc:
                    for field, problems in exc.errors.items():
                        form.add_error(field if field in form.fields else None, problems)
                else:
                    self.message_user(request, f"Added item #{item.position} ({item.get_split_display()}) to "
                                               f"{item.golden_set.name} from invocation {invocation.pk}.",
                                      messages.SUCCESS)
                    return HttpResponseRedirect(back + "#ev-invocation-evals")
            errors = "; ".join(f"{field}: {' '.join(problems)}" for field, problems in form.errors.items())
            self.message_user(request, f"Not added: {errors}", messages.ERROR)
        context = {**self.admin_site.each_context(request), "opts": self.opts, "form": form,
                   "invocation": invocation, "back_url": back,
                   "title": f"Add invocation {invocation.pk} to a golden set"}
        return TemplateResponse(request, "admin/evals/goldenitem/from_invocation.html", context,
                                status=400 if form.is_bound else 200)
