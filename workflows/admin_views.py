"""The workflow version admin's own pages, beside its change page (`VersionViews`, mixed into
`WorkflowVersionAdmin`; URLs `admin:workflows_workflowversion_<name>`):

- diff: what changed from the version's first parent (or `?against=<id>`, another version of the same
  workflow) to it, per node (fields and a coloured prompt diff) and as a diff of the canonical DSL;
- run: a form drawn from the version's input schema (``InputForm``); a valid input starts an invocation
  (``services.invocation_start``) and opens its page;
- edit: the DSL as pretty JSON in an editor; saving validates it as the API does
  (``services.workflow_version_create``) and writes a child version (operation manual, parent 1 this
  version), or leads to the version that already has that DSL.

Every view treats a missing version, or one of another workspace, as missing (404) and needs the view
permission; run needs the permission to add workflow invocations, edit the permission to add workflow
versions. POSTs go through the admin's CSRF protection (`admin_view`).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from config.display import diff_lines, pretty_json
from config.forms import JSONTextField
from workflows import dsl as dsl_module
from workflows import selectors, services
from workflows.models import WorkflowVersion

AGAINST_CHOICES = 50  # versions of the workflow offered to diff against
EDITOR_LIMIT = 1_000_000  # characters of DSL the editor takes
RUN_PERMISSION = "workflows.add_workflowinvocation"
EDIT_PERMISSION = "workflows.add_workflowversion"


# -------------------------------------------------------------------------------------------- input

WHOLE_INPUT = "input"  # the one JSON field of a schema that names no properties
PROPERTY_PREFIX = "input-"
LONG_STRING = 200  # a string property allowed longer than this gets a textarea


def _refuse_constant(name: str):
    # a JSONDecodeError, so that Django's JSONField reports it as invalid JSON (a ValueError would escape it)
    raise json.JSONDecodeError(f"{name} is not a JSON number", name, 0)


class StrictJSONDecoder(json.JSONDecoder):
    """JSON as Postgres stores it: NaN and Infinity are refused (Python's json reads them)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "parse_constant": _refuse_constant})


class InputJSONField(JSONTextField):
    """A JSON text of an input: strict (``StrictJSONDecoder``), and empty when it has no value (not `null`); an
    empty list or object is a value given."""

    empty_values = [None, ""]

    def __init__(self, **kwargs):
        super().__init__(decoder=StrictJSONDecoder, **kwargs)

    def prepare_value(self, value):
        return "" if value is None else super().prepare_value(value)



def _single_type(spec: dict) -> str | None:
    """The JSON type a property declares, when it is one ("string", or ["string", "null"]); else None."""
    kind = spec.get("type")
    if isinstance(kind, list):
        kinds = [item for item in kind if item != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def _number(spec: dict, key: str):
    value = spec.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _length(spec: dict, key: str) -> int | None:
    value = spec.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def property_field(name: str, spec, *, required: bool) -> forms.Field:
    """The form field of one property of an input schema: a choice for an enum, a text, number, whole
    number or checkbox for those types, a JSON text for anything else."""
    spec = spec if isinstance(spec, dict) else {}
    common = {"label": str(spec.get("title") or name), "required": required,
              "help_text": str(spec.get("description") or "")}
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        choices = [(json.dumps(value, sort_keys=True), value if isinstance(value, str) else json.dumps(value))
                   for value in enum]
        return forms.TypedChoiceField(choices=([] if required else [("", "---------")]) + choices,
                                      coerce=json.loads, empty_value=None, **common)
    kind = _single_type(spec)
    if kind == "string":
        longest = _length(spec, "maxLength")
        widget = forms.TextInput(attrs={"size": 60}) if longest is not None and longest <= LONG_STRING \
            else forms.Textarea(attrs={"rows": 3, "cols": 80})
        return forms.CharField(max_length=longest, min_length=_length(spec, "minLength"), strip=False,
                               widget=widget, **common)
    if kind == "integer":
        return forms.IntegerField(min_value=_number(spec, "minimum"), max_value=_number(spec, "maximum"), **common)
    if kind == "number":
        return forms.FloatField(min_value=_number(spec, "minimum"), max_value=_number(spec, "maximum"),
                                widget=forms.NumberInput(attrs={"step": "any"}), **common)
    if kind == "boolean":
        # a checkbox always answers (true or false), so a required boolean is always given
        return forms.BooleanField(**{**common, "required": False})
    return InputJSONField(widget=forms.Textarea(attrs={"rows": 4, "cols": 80, "class": "wf-code"}),
                           help_text=(common.pop("help_text") + " (JSON)").strip(), **common)


class InputForm(forms.Form):
    """An invocation's input, drawn from a version's input schema (JSON Schema): a field per property of an
    object schema, or one JSON text for any other schema (or none). The assembled input is checked against
    the whole schema too (patterns, bounds of nested values), each error on the field it names."""

    required_css_class = "required"
    node_budget = forms.IntegerField(required=False, min_value=1, max_value=1000,
                                     help_text="Node invocations it may run (empty: the installation's default).")
    usd_budget = forms.DecimalField(required=False, min_value=Decimal("0.0000000001"), max_value=1_000_000,
                                    max_digits=18, decimal_places=10, label="USD budget",
                                    help_text="USD it may spend on model calls (empty: the installation's default).")

    def __init__(self, *args, schema, **kwargs):
        super().__init__(*args, **kwargs)
        self.schema = schema if isinstance(schema, dict) else {}
        properties = self.schema.get("properties")
        self.properties = properties if isinstance(properties, dict) and properties and \
            _single_type(self.schema) in (None, "object") else {}
        required = self.schema.get("required")
        required = list(dict.fromkeys(name for name in required if isinstance(name, str))) \
            if isinstance(required, list) else []
        fields: dict[str, forms.Field] = {}
        if self.properties:
            # the stored schema's keys come back sorted (jsonb): the required properties first, in their order
            order = [name for name in required if name in self.properties] + sorted(
                name for name in self.properties if name not in required)
            for name in order:
                fields[PROPERTY_PREFIX + name] = property_field(name, self.properties[name], required=name in required)
        else:
            fields[WHOLE_INPUT] = InputJSONField(
                initial={"text": ""}, required=False, label="input",
                widget=forms.Textarea(attrs={"rows": 8, "cols": 80, "class": "wf-code"}),
                help_text="Any JSON: the task the entry node receives (an object's `text` is its question).")
        self.fields = {**fields, **self.fields}
        self.input_fields = list(fields)

    def clean(self):
        data = super().clean()
        if self.properties:
            value = {}
            for name in self.properties:
                item = data.get(PROPERTY_PREFIX + name)
                if item is not None and item != "":
                    value[name] = item
        else:
            value = data.get(WHOLE_INPUT)
        if not self.errors:
            self._check_schema(value)
        data["input"] = value
        return data

    def _check_schema(self, value) -> None:
        check = services.input_check(self.schema, value)
        if check.refused:
            self.add_error(self._field_of(self._pattern_path(value)) if check.timed_out else None, check.refused)
        for where, message in check.errors:
            self.add_error(self._field_of(where), message)

    def _pattern_path(self, value) -> list:
        """Where a timed-out pattern was matched: the one property with a pattern, when there is one."""
        patterned = [name for name, spec in self.properties.items()
                     if isinstance(spec, dict) and "pattern" in spec and isinstance(value, dict) and name in value]
        return patterned[:1] if len(patterned) == 1 else []

    def _field_of(self, where: list) -> str | None:
        """The field an error at `where` (a path into the input) belongs to; None: above the form."""
        if not self.properties:
            return WHOLE_INPUT
        name = PROPERTY_PREFIX + str(where[0]) if where else ""
        return name if name in self.input_fields else None


def refusal_errors(form: InputForm, errors: dict[str, list[str]]) -> None:
    """An InvocationRefused's errors on the fields they name (budgets, input); tools and models the version
    lacks are listed above the form already, and named once there."""
    for key, problems in errors.items():
        if key in ("tools", "models"):
            form.add_error(None, "Not started: this version cannot run on this installation (see above).")
            continue
        field = key if key in form.fields else WHOLE_INPUT if WHOLE_INPUT in form.fields else None
        for problem in problems:
            form.add_error(field, problem if field else f"{key}: {problem}")


# --------------------------------------------------------------------------------------------- edit

class DslEditForm(forms.Form):
    dsl = forms.CharField(label="DSL (JSON)", strip=False, max_length=EDITOR_LIMIT, widget=forms.Textarea(
        attrs={"rows": 32, "cols": 120, "class": "wf-code wf-dsl-editor", "spellcheck": "false"}))
    commit_message = forms.CharField(max_length=2000, widget=forms.TextInput(attrs={"size": 100}),
                                     help_text="What changed and why: the new version's commit message.")


NODE_PATH = re.compile(r"^nodes\[(?P<ref>.*)\](?:\.(?P<field>\w+))?$")


def dsl_error_groups(errors: dict[str, list[str]], document) -> list[dict]:
    """DslError's errors grouped by the node they name (`nodes[planner].systemPrompt`, or `nodes[2]` for a node
    without an id), in the document's order, after those of the workflow itself (`entryNodeId`, `nodes`):
    [{"node": id or None, "label", "problems": [{"field", "message"}]}]."""
    nodes = document.get("nodes") if isinstance(document, dict) else None
    nodes = nodes if isinstance(nodes, list) else []
    order = {node.get("nodeId"): index for index, node in enumerate(nodes)
             if isinstance(node, dict) and isinstance(node.get("nodeId"), str)}
    groups: dict[tuple, dict] = {}
    for where, problems in errors.items():
        match = NODE_PATH.match(where)
        if match is None:
            key, label, node, field = (-1, ""), "the workflow", None, where
        else:
            ref, field = match["ref"], match["field"] or ""
            if ref in order:
                key, label, node = (order[ref], ref), f"node {ref}", ref
            elif ref.isdigit():
                key, label, node = (int(ref), ""), f"node #{int(ref) + 1} (no nodeId)", None
            else:
                key, label, node = (len(nodes), ref), f"node {ref}", ref
        group = groups.setdefault(key, {"node": node, "label": label, "problems": []})
        group["problems"].extend({"field": field or "(the node)", "message": message} for message in problems)
    return [groups[key] for key in sorted(groups)]


# --------------------------------------------------------------------------------------------- diff

def changed_nodes(old: WorkflowVersion, new: WorkflowVersion, changes: dict) -> list[dict]:
    """The nodes of a version_diff with their change, each changed field's value before and after (the
    prompt as a coloured diff instead), added and removed nodes first."""
    before = {node["nodeId"]: node for node in old.dsl["nodes"]}
    after = {node["nodeId"]: node for node in new.dsl["nodes"]}
    rows = []
    for node_id, change in changes["nodes"].items():
        if node_id == "__entry__":
            fields = [{"name": "entryNodeId", "old": old.dsl.get("entryNodeId"), "new": new.dsl.get("entryNodeId")}]
            rows.append({"node": "", "label": "the workflow", "change": "changed", "fields": fields, "lines": []})
            continue
        fields = [{"name": name, "old": json.dumps(before[node_id].get(name), ensure_ascii=False),
                   "new": json.dumps(after[node_id].get(name), ensure_ascii=False)}
                  for name in change.get("fields", []) if name != "systemPrompt"]
        rows.append({"node": node_id, "label": f"node {node_id}", "change": change["change"], "fields": fields,
                     "prompt_changed": "systemPrompt" in change.get("fields", []),
                     "lines": diff_lines(change.get("prompt_diff", []), prefix="wf")})
    rank = {"added": 0, "removed": 1, "changed": 2, "same": 3}
    return sorted(rows, key=lambda row: (rank[row["change"]], row["node"]))


# -------------------------------------------------------------------------------------------- views

class VersionViews:
    """Diff, run and edit of a version (mixed into `WorkflowVersionAdmin`, whose `get_object` scopes the row)."""

    def get_urls(self):
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        views = (("diff", self.diff_view), ("run", self.run_view), ("edit", self.edit_view))
        return [*(path(f"<path:object_id>/{name}/", self.admin_site.admin_view(view), name=f"{info}_{name}")
                  for name, view in views), *super().get_urls()]

    def _version(self, request, object_id, *, permission: str = "") -> WorkflowVersion:
        """The version a view works on; a missing or foreign one is a 404, a missing permission a 403."""
        version = self.get_object(request, unquote(object_id))
        if version is None:
            raise Http404("No such version in your workspaces.")
        if not self.has_view_permission(request, version) or (permission and not request.user.has_perm(permission)):
            raise PermissionDenied
        return version

    def _page(self, request, version: WorkflowVersion, template: str, title: str, status: int = 200, **context):
        return TemplateResponse(request, f"admin/workflows/workflowversion/{template}", {
            **self.admin_site.each_context(request), "opts": self.opts, "original": version, "title": title,
            "subtitle": f"{version.workflow.name} @ {version.dsl_hash[:12]}",
            "change_url": reverse("admin:workflows_workflowversion_change", args=[quote(version.pk)]),
            **context}, status=status)

    def version_links(self, request, version: WorkflowVersion) -> dict:
        """The change page's links to these views, each offered only to a user it would not refuse."""
        def url(name):
            return reverse(f"admin:workflows_workflowversion_{name}", args=[quote(version.pk)])

        return {"diff_url": url("diff"), "run_url": url("run"), "edit_url": url("edit"),
                "can_run": request.user.has_perm(RUN_PERMISSION), "can_edit": request.user.has_perm(EDIT_PERMISSION)}

    def diff_view(self, request, object_id):
        version = self._version(request, object_id)
        raw = request.GET.get("against", "").strip()
        other, error = None, ""
        if raw:
            if raw.isascii() and raw.isdigit() and len(raw) <= 18:
                other = self.scope(request, WorkflowVersion.objects.filter(
                    pk=int(raw), workflow_id=version.workflow_id)).first()
            if other is None:
                error = f"against: {raw!r} is not a version of {version.workflow.name}."
        elif version.parent1_id:
            other = self.scope(request, WorkflowVersion.objects.filter(pk=version.parent1_id)).first()
        offered = [row for row in selectors.workflow_versions_recent(workflow_id=version.workflow_id,
                                                                    limit=AGAINST_CHOICES + 1)
                   if row.pk != version.pk][:AGAINST_CHOICES]
        changes = selectors.version_diff(other, version) if other is not None else None
        return self._page(
            request, version, "diff.html", "Diff with parent" if other is not None and other.pk == version.parent1_id
            else "Diff", status=400 if error else 200, other=other, error=error, changes=changes,
            nodes=changed_nodes(other, version, changes) if changes else [],
            dsl_lines=diff_lines(changes["dsl_diff"], prefix="wf") if changes else [],
            offered=offered, against=other.pk if other is not None else None,
            other_url=reverse("admin:workflows_workflowversion_change", args=[quote(other.pk)]) if other else "")

    def run_view(self, request, object_id):
        version = self._version(request, object_id, permission=RUN_PERMISSION)
        form = InputForm(request.POST if request.method == "POST" else None, schema=version.input_schema)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                invocation = services.invocation_start(version=version, input=data["input"], user=request.user,
                                                       node_budget=data["node_budget"], usd_budget=data["usd_budget"])
            except services.InvocationRefused as exc:
                refusal_errors(form, exc.errors)
            else:
                self.message_user(request, format_html(
                    "Started invocation {} of {} @ {}; it runs in the background.", invocation.pk,
                    version.workflow.name, version.dsl_hash[:12]), messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:workflows_workflowinvocation_change",
                                                    args=[quote(invocation.pk)]))
        return self._page(request, version, "run.html", "Run", status=400 if form.is_bound else 200, form=form,
                          input_fields=[form[name] for name in form.input_fields],
                          budget_fields=[form["node_budget"], form["usd_budget"]],
                          problems=services.version_problems(version), schema_text=pretty_json(version.input_schema))

    def edit_view(self, request, object_id):
        version = self._version(request, object_id, permission=EDIT_PERMISSION)
        groups: list[dict] = []
        if request.method != "POST":
            form = DslEditForm(initial={"dsl": pretty_json(version.dsl)})
            return self._page(request, version, "edit.html", "Edit as new version", form=form, groups=groups)
        form = DslEditForm(request.POST)
        if form.is_valid():
            try:
                document = json.loads(form.cleaned_data["dsl"], cls=StrictJSONDecoder)
            except json.JSONDecodeError as exc:
                form.add_error("dsl", f"Not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).")
            except RecursionError:
                form.add_error("dsl", "Not JSON this editor reads: nested too deeply.")
            else:
                try:
                    written, created = services.workflow_version_create(
                        workflow=version.workflow, dsl=document, operation=WorkflowVersion.Operation.MANUAL,
                        parents=(version,), commit_message=form.cleaned_data["commit_message"],
                        created_by=request.user)
                except dsl_module.DslError as exc:
                    groups = dsl_error_groups(exc.errors, document)
                else:
                    return self._written(request, version, written, created)
        return self._page(request, version, "edit.html", "Edit as new version", status=400, form=form,
                          groups=groups)

    def _written(self, request, version: WorkflowVersion, written: WorkflowVersion, created: bool):
        label = written.dsl_hash[:12]
        if created:
            self.message_user(request, f"Saved version {label} of {version.workflow.name}, a manual edit of "
                                       f"{version.dsl_hash[:12]}.", messages.SUCCESS)
        elif written.pk == version.pk:
            self.message_user(request, f"Nothing saved: the DSL is unchanged (it is this version, {label}).",
                              messages.WARNING)
        else:
            self.message_user(request, f"Nothing saved: version {label} of {version.workflow.name} already has this "
                                       "DSL (versions are addressed by their DSL's hash).", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:workflows_workflowversion_change", args=[quote(written.pk)]))
