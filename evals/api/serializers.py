from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from evals import importing
from evals.conf import MAX_CONCURRENCY
from evals.graders import GRADER_KINDS, GraderConfigError, validate_graders
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet, Promotion, default_graders
from evals.selectors import split_plan
from evals.services import item_errors
from evals.splits import SPLITS
from workflows.api.serializers import NULLABLE_URI, _link, _list_link
from workflows.models import Workflow, WorkflowInvocation, WorkflowVersion
from workspaces.api.base import WorkspaceField, member_workspace_ids

MAX_INT = 2**31 - 1
USD = WorkflowInvocation._meta.get_field("usd_budget")


def _graders_guide() -> str:
    """The graders' documentation (evals/graders/guide.md, from its Configuration section on), so the schema says
    what each grader does and which options it takes."""
    doc = (Path(__file__).resolve().parent.parent / "graders" / "guide.md").read_text(encoding="utf-8")
    start = doc.find("## Configuration\n")
    return doc[start:].strip() if start >= 0 else doc.strip()


GRADERS_GUIDE = _graders_guide()
GRADERS_HELP = ('The graders and their weights: a list of 1 to 10 entries {"kind": ..., "weight": ..., options}; '
                f"kinds: {', '.join(GRADER_KINDS)}. Each kind and option is documented in "
                "evals/graders/guide.md (quoted in the golden-set create operation). A bad entry is a 400 naming "
                '`graders[i].option`. Default: [{"kind": "llm_judge", "weight": 1}].')


class ScopedPrimaryKeyField(serializers.PrimaryKeyRelatedField):
    """A row chosen by id among the caller's workspaces only: another workspace's id is "does not exist",
    like a missing one. Rendered as a number box, never a select listing every row."""

    def __init__(self, *, model, workspace_field: str, **kwargs):
        self.model = model
        self.workspace_field = workspace_field
        kwargs.setdefault("queryset", model.objects.all())
        kwargs.setdefault("style", {"base_template": "input.html"})
        super().__init__(**kwargs)

    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return self.model.objects.none()
        return self.model.objects.filter(**{f"{self.workspace_field}__in": member_workspace_ids(request.user)})


def golden_set_field(**kwargs):
    return ScopedPrimaryKeyField(model=GoldenSet, workspace_field="workspace", **kwargs)


def version_field(**kwargs):
    return ScopedPrimaryKeyField(model=WorkflowVersion, workspace_field="workflow__workspace", **kwargs)


def _text(max_length: int, **kwargs):
    return serializers.CharField(max_length=max_length, required=False, allow_blank=True, default="",
                                 trim_whitespace=False, **kwargs)


# -------------------------------------------------------------------------------------------- golden sets

def _per_split(name: str, field: type[serializers.Field]) -> type[serializers.Serializer]:
    """A serializer of one `field` for each split (the schema names it `name`)."""
    return type(name, (serializers.Serializer,), {split: field() for split in SPLITS})


SplitCountsSerializer = _per_split("SplitCountsSerializer", serializers.IntegerField)
SplitSharesSerializer = _per_split("SplitSharesSerializer", serializers.FloatField)


class SplitPlanSerializer(serializers.Serializer):
    held_out = serializers.BooleanField(help_text="Whether the splits can carry a held-out claim.")
    reason = serializers.CharField(help_text='Why not ("" when they can).')
    total = serializers.IntegerField()
    counts = SplitCountsSerializer(help_text="Items per split.")
    min_items = serializers.IntegerField(help_text="EVAL_MIN_SPLIT_ITEMS: the fewest items a held-out claim needs.")
    min_per_split = serializers.IntegerField(help_text="The fewest items each split needs.")
    proportions = SplitSharesSerializer(help_text="EVAL_SPLIT_PROPORTIONS: the shares new items are dealt by.")


class GoldenSetSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="golden-set-detail")
    workspace = WorkspaceField()
    workflow = ScopedPrimaryKeyField(model=Workflow, workspace_field="workspace", required=False, allow_null=True,
                                     help_text="The workflow this set evaluates (one of the set's workspace).")
    description = _text(10_000)
    pass_threshold = serializers.FloatField(min_value=0.0, max_value=1.0, required=False, default=0.7,
                                            help_text="An item passes when its score is at least this (0..1).")
    graders = serializers.JSONField(required=False, default=default_graders, help_text=GRADERS_HELP)
    item_count = serializers.IntegerField(read_only=True)
    split_plan = serializers.SerializerMethodField(
        help_text="Its items per split (train, validation, test) and whether they can carry a held-out claim: "
                  "`held_out` false with the `reason` when the set is under EVAL_MIN_SPLIT_ITEMS items or a split "
                  "under its minimum.")
    items_url = serializers.SerializerMethodField(help_text="Its items, in order (the item list, filtered).")
    eval_runs_url = serializers.SerializerMethodField(help_text="Its eval runs (the eval-run list, filtered).")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = GoldenSet
        fields = ["id", "url", "workspace", "workflow", "name", "description", "pass_threshold", "graders",
                  "item_count", "split_plan", "items_url", "eval_runs_url", "created_by", "created_at", "updated_at"]
        read_only_fields = ["id", "created_at", "updated_at"]
        validators = []  # the duplicate check in validate() names the `name` field

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None:
            fields["workspace"].read_only = True  # a golden set never moves to another workspace
        return fields

    def get_items_url(self, obj) -> str:
        return _list_link(self.context.get("request"), "golden-item-list", f"?golden_set={obj.pk}")

    @extend_schema_field(SplitPlanSerializer)
    def get_split_plan(self, obj) -> dict:
        counts = {split: getattr(obj, f"{split}_count", None) for split in SPLITS}
        plan = split_plan(obj, counts=counts if None not in counts.values() else None)
        return {key: value for key, value in plan.as_dict().items() if key != "strata"}

    def get_eval_runs_url(self, obj) -> str:
        return _list_link(self.context.get("request"), "eval-run-list", f"?golden_set={obj.pk}")

    def validate(self, attrs):
        workspace = attrs.get("workspace", getattr(self.instance, "workspace", None))
        if "workflow" in attrs and attrs["workflow"] is not None and attrs["workflow"].workspace_id != workspace.pk:
            raise serializers.ValidationError({"workflow": ["Belongs to another workspace than the golden set."]})
        if "graders" in attrs:
            try:
                attrs["graders"] = validate_graders(attrs["graders"])
            except GraderConfigError as exc:
                raise serializers.ValidationError(exc.errors) from None
        name = attrs.get("name", getattr(self.instance, "name", None))
        duplicate = GoldenSet.objects.filter(workspace=workspace, name=name)
        if self.instance is not None:
            duplicate = duplicate.exclude(pk=self.instance.pk)
        if duplicate.exists():
            raise serializers.ValidationError({"name": ["A golden set with this name exists in the workspace."]})
        return attrs


class ImportRequestSerializer(serializers.Serializer):
    """A JSON body of the import: the items as objects (each validated like a JSONL line)."""

    items = serializers.ListField(child=serializers.JSONField(), max_length=importing.MAX_ITEMS,
                                  help_text="Item objects with the keys of a JSONL line; `line` in an error is the "
                                            "item's 1-based index.")


class ImportUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="A .jsonl (one JSON object a line) or .csv file (a header row), UTF-8.")


class ImportLineErrorSerializer(serializers.Serializer):
    line = serializers.IntegerField(help_text="1-based line of the file (a CSV record: the line it starts on).")
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()),
                                   help_text="The messages of each offending column or key.")


class ImportResultSerializer(serializers.Serializer):
    created = serializers.IntegerField(help_text="Items written.")
    items = serializers.ListField(child=serializers.IntegerField(), help_text="Their ids, in line order.")
    errors = ImportLineErrorSerializer(many=True, help_text="Lines left out (only with ?partial=1).")
    items_url = serializers.URLField()


class ImportRefusedSerializer(serializers.Serializer):
    """The error body of a refused import: the one error shape, with each bad line under `errors`."""

    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(required=False)
    errors = ImportLineErrorSerializer(many=True, required=False)


class ImportRefusedBodySerializer(serializers.Serializer):
    error = ImportRefusedSerializer()


# ---------------------------------------------------------------------------------------------- items

class GoldenItemSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="golden-item-detail")
    golden_set = golden_set_field(help_text="The golden set (one of yours); an item never moves to another.")
    position = serializers.IntegerField(min_value=0, max_value=MAX_INT, required=False,
                                        help_text="Order in the set (default: after the last item).")
    input = serializers.JSONField(help_text="What the workflow is invoked with (any JSON; not empty).")
    expected_output = _text(importing.MAX_EXPECTED_OUTPUT,
                            help_text="The reference answer (a JSON answer as its JSON text).")
    scoring_criteria = _text(importing.MAX_CRITERIA, help_text="What the LLM judge weighs besides the expected output.")
    rubric = serializers.JSONField(required=False, default=list,
                                   help_text='Criteria with points: [{"criterion": "...", "max_points": 2}, ...].')
    tags = serializers.JSONField(required=False, default=list,
                                 help_text='Short names; "critical" items block a promotion that regresses them.')
    metadata = serializers.JSONField(required=False, default=dict, help_text="Any JSON object.")
    split = serializers.ChoiceField(choices=GoldenItem.Split.choices, required=False,
                                    help_text="train, validation or test: where evolution uses the item. Left out on "
                                              "create, the item is dealt one by its first tag (evals/splits.py); the "
                                              "set's other items keep theirs.")

    class Meta:
        model = GoldenItem
        fields = ["id", "url", "golden_set", "position", "input", "expected_output", "scoring_criteria", "rubric",
                  "tags", "metadata", "split", "content_hash", "created_at", "updated_at"]
        read_only_fields = ["id", "content_hash", "created_at", "updated_at"]

    def get_fields(self):
        fields = super().get_fields()
        if self.instance is not None:
            fields["golden_set"].read_only = True
        return fields

    def validate(self, attrs):
        names = ("input", "expected_output", "scoring_criteria", "rubric", "tags", "metadata", "split")
        values = {name: attrs.get(name, getattr(self.instance, name, None)) for name in names}
        errors = item_errors(**values)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


# ------------------------------------------------------------------------------------------- eval runs

class EvalRunSerializer(serializers.ModelSerializer):
    """An eval run in a list: status, progress and aggregates (the detail adds its config and histogram)."""

    url = serializers.HyperlinkedIdentityField(view_name="eval-run-detail")
    golden_set_url = serializers.SerializerMethodField()
    workflow = serializers.IntegerField(source="workflow_pk", read_only=True)
    workflow_version_url = serializers.SerializerMethodField()
    durable_run = serializers.CharField(source="durable_run_id", read_only=True, allow_null=True,
                                        help_text="The id of the durable run that drives it.")
    durable_run_url = serializers.SerializerMethodField()
    results_url = serializers.SerializerMethodField(help_text="Its per-item results, in item order.")
    # text, not an enum: an `origin` enum would collide with the skills' in the schema's component names
    origin = serializers.CharField(read_only=True, help_text="What started it: "
                                                             f"{', '.join(EvalRun.Origin.values)}.")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = EvalRun
        fields = ["id", "url", "workspace", "golden_set", "golden_set_url", "workflow", "workflow_version",
                  "workflow_version_url", "status", "origin", "reuse", "items_total", "items_done", "items_reused",
                  "grading_errors", "avg_score", "pass_rate", "usd_cost", "paid_usd", "judge_usd", "latency_p50_ms",
                  "latency_p95_ms", "fitness", "regression", "error", "durable_run", "durable_run_url",
                  "results_url", "created_by", "created_at", "updated_at", "started_at", "ended_at"]
        read_only_fields = fields

    def get_golden_set_url(self, obj) -> str:
        return _link(self.context.get("request"), "golden-set-detail", obj.golden_set_id)

    def get_workflow_version_url(self, obj) -> str:
        return _link(self.context.get("request"), "workflow-version-detail", obj.workflow_version_id)

    @extend_schema_field(NULLABLE_URI)
    def get_durable_run_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "durable-run-detail", obj.durable_run_id)

    def get_results_url(self, obj) -> str:
        return _link(self.context.get("request"), "eval-run-results", obj.pk)


class HistogramBinSerializer(serializers.Serializer):
    low = serializers.FloatField()
    high = serializers.FloatField(help_text="Exclusive, but the last bin includes 1.0.")
    count = serializers.IntegerField()


class EvalRunDetailSerializer(EvalRunSerializer):
    histogram = serializers.SerializerMethodField(help_text="Counts of the graded scores in ten bins over 0..1.")

    class Meta(EvalRunSerializer.Meta):
        fields = [*EvalRunSerializer.Meta.fields, "config", "histogram"]
        read_only_fields = fields

    @extend_schema_field(HistogramBinSerializer(many=True))
    def get_histogram(self, obj):
        from evals.selectors import score_histogram

        return HistogramBinSerializer(score_histogram(obj), many=True).data


class EvalRunStartSerializer(serializers.Serializer):
    golden_set = golden_set_field(help_text="The golden set to score on (one of yours).")
    workflow_version = version_field(help_text="The version to score (of the golden set's workspace).")
    reuse = serializers.BooleanField(default=True, help_text="Reuse earlier results of the same version, item "
                                                             "contents and graders (false: run every item again).")
    concurrency = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_CONCURRENCY,
                                           help_text="Items invoked at once (default: EVAL_CONCURRENCY).")
    node_budget = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=1000,
                                           help_text="Node invocations each item may run (default: "
                                                     "WORKFLOW_NODE_BUDGET).")
    usd_budget = serializers.DecimalField(required=False, allow_null=True, max_digits=USD.max_digits,
                                          decimal_places=USD.decimal_places,
                                          min_value=Decimal(1).scaleb(-USD.decimal_places),
                                          max_value=Decimal(1_000_000),
                                          help_text="USD each item may spend (default: WORKFLOW_USD_BUDGET).")


class EvalRunCancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, default="cancelled by an operator")


class GoldenResultSerializer(serializers.ModelSerializer):
    item = serializers.IntegerField(source="golden_item_id", read_only=True, help_text="The golden item's id.")
    item_url = serializers.SerializerMethodField()
    position = serializers.IntegerField(read_only=True, help_text="The item's position in its set.")
    rationale = serializers.CharField(source="grading_rationale", read_only=True)
    workflow_invocation_url = serializers.SerializerMethodField()

    class Meta:
        model = GoldenResult
        fields = ["id", "item", "item_url", "position", "score", "passed", "grader", "rationale", "grades",
                  "actual_output", "error", "grading_error", "latency_ms", "usd_cost", "judge_usd",
                  "workflow_version", "workflow_invocation", "workflow_invocation_url", "reused_from", "created_at"]
        read_only_fields = fields

    def get_item_url(self, obj) -> str:
        return _link(self.context.get("request"), "golden-item-detail", obj.golden_item_id)

    @extend_schema_field(NULLABLE_URI)
    def get_workflow_invocation_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "workflow-invocation-detail", obj.workflow_invocation_id)


class ProposalSerializer(serializers.Serializer):
    node_id = serializers.CharField(help_text="The node whose prompt was rewritten (the one whose answer is graded).")
    failure_analysis = serializers.CharField(allow_blank=True)
    changelog = serializers.ListField(child=serializers.CharField())
    confidence = serializers.FloatField(help_text="The share of the failures the changes address (0..1).")
    skipped = serializers.CharField(allow_blank=True, help_text="Why no candidate was proposed (empty when one was).")
    rewriter = serializers.CharField(allow_blank=True, help_text='"offline-rules" or the model that rewrote.')
    version = serializers.IntegerField(allow_null=True, help_text="The candidate version (null when skipped).")
    version_url = serializers.SerializerMethodField()
    created = serializers.BooleanField(help_text="False when the same DSL was already a version (it is returned).")

    @extend_schema_field(NULLABLE_URI)
    def get_version_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "workflow-version-detail", obj.get("version"))


# --------------------------------------------------------------------------------------------- compare

class ComparisonSerializer(serializers.Serializer):
    n = serializers.IntegerField(help_text="Items both runs graded.")
    mean_a = serializers.FloatField(allow_null=True)
    mean_b = serializers.FloatField(allow_null=True)
    mean_diff = serializers.FloatField(allow_null=True, help_text="b - a.")
    ci_low = serializers.FloatField(allow_null=True, help_text="95% paired-bootstrap interval of mean_diff.")
    ci_high = serializers.FloatField(allow_null=True)
    p_value = serializers.FloatField(allow_null=True, help_text="Wilcoxon signed-rank, two-sided.")
    alpha = serializers.FloatField()
    test = serializers.CharField()
    verdict = serializers.ChoiceField(choices=["better", "worse", "no significant difference", "not enough data"],
                                      help_text="Of b against a.")


class CompareItemSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    a = serializers.FloatField(allow_null=True, help_text="Its score in a's run (null: not graded).")
    b = serializers.FloatField(allow_null=True)
    critical = serializers.BooleanField()


class CriticalRegressionSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    a = serializers.FloatField()
    b = serializers.FloatField()


class CompareSerializer(serializers.Serializer):
    golden_set = serializers.IntegerField()
    version_a = serializers.IntegerField()
    version_b = serializers.IntegerField()
    eval_run_a = serializers.IntegerField(help_text="a's latest completed eval run on the set.")
    eval_run_b = serializers.IntegerField()
    comparison = ComparisonSerializer()
    critical_regressions = CriticalRegressionSerializer(
        many=True, help_text="Critical items b scores lower than a by more than the tolerance.")
    critical_tolerance = serializers.FloatField()
    items = CompareItemSerializer(many=True, help_text="Every item of the set, in order, side by side.")


# ------------------------------------------------------------------------------------------ promotions

class PromotionSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="promotion-detail")
    workspace = serializers.IntegerField(source="workflow.workspace_id", read_only=True)
    workflow_version_url = serializers.SerializerMethodField()
    decided_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    evidence = serializers.JSONField(read_only=True, help_text="What the activation was decided on: the comparison "
                                                               "(as compare/ answers it) for a promotion.")

    class Meta:
        model = Promotion
        fields = ["id", "url", "workspace", "workflow", "workflow_version", "workflow_version_url",
                  "previous_version", "golden_set", "action", "evidence", "decided_by", "created_at"]
        read_only_fields = fields

    def get_workflow_version_url(self, obj) -> str:
        return _link(self.context.get("request"), "workflow-version-detail", obj.workflow_version_id)


class PromoteSerializer(serializers.Serializer):
    golden_set = golden_set_field(help_text="The golden set the candidate is compared on against the active version "
                                            "(both need a completed eval run on it).")


class PromotionRefusedSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField()
    message = serializers.CharField()
    evidence = serializers.JSONField(help_text="The comparison that refused it (as compare/ answers it).")


class PromotionRefusedBodySerializer(serializers.Serializer):
    error = PromotionRefusedSerializer()
