from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from evals.api.serializers import ScopedPrimaryKeyField, golden_set_field, version_field
from evolution.conf import DEFAULTS, LIMITS
from evolution.models import EvolutionRun, Generation, Individual
from evolution.operators import MUTATION_WEIGHTS
from workflows.api.serializers import NULLABLE_URI, _link
from workflows.models import Workflow, WorkflowVersion

GOAL_MAX = 10_000
FITNESS_HELP = ("The fitness (0-100, docs/fitness.md) of the version's eval run on the items the search scored: the "
                "train split with a held-out claim, else the whole golden set (`report` has every split).")
# at most this many nodes in a genealogy (the run's individuals first), and in each of a lineage's lists
GENEALOGY_MAX_NODES = 3000
LINEAGE_MAX_NODES = 2000
LINEAGE_MAX_DEPTH = 1000


def _config_property(key: str, default) -> dict:
    if key == "mutation_weights":
        return {"type": "object", "nullable": True, "default": None, "additionalProperties": False,
                "properties": {name: {"type": "number", "minimum": 0, "description": f"default {weight}"}
                               for name, weight in MUTATION_WEIGHTS.items()},
                "description": "Relative weights of the mutation kinds (some of them, at least one above 0); "
                               "null: docs/operators.md's, shown per kind."}
    kind, low, high = LIMITS[key]
    return {"type": "integer" if kind is int else "number", "minimum": low, "maximum": high, "default": default}


CONFIG_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {key: _config_property(key, default) for key, default in DEFAULTS.items()},
    "description": "Overrides of the run's settings (evolution/conf.py); a setting left out takes its default. "
                   "Besides each one's range: `elites` is fewer than `population`, and `crossover_rate` + "
                   "`mutation_rate` is at most 1 (the rest of the draws bring immigrants). An unknown setting or "
                   "a value out of range is a 400 naming it (`config.population`).",
}


def config_guide() -> str:
    """The settings of a run, their defaults and ranges, as the create operation documents them."""
    lines = ["| setting | default | range |", "| --- | --- | --- |"]
    for key, default in DEFAULTS.items():
        if key in LIMITS:
            kind, low, high = LIMITS[key]
            span = f"{'whole number' if kind is int else 'number'} from {low} to {high}"
        else:
            span = f"null or weights >= 0 of {', '.join(MUTATION_WEIGHTS)}"
        lines.append(f"| `{key}` | `{'null' if default is None else default}` | {span} |")
    return "\n".join(lines)


@extend_schema_field(CONFIG_SCHEMA)
class ConfigField(serializers.JSONField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object of settings, for example {\"population\": 8}.")
        return value


# ------------------------------------------------------------------------------------------------ runs

_FITNESS = {"type": "number", "nullable": True}
_SIDE = {"type": "object", "description": "A version's fitness (0-100) on each split it was scored on: train, "
                                          "validation and test with a held-out claim, whole_set without one.",
         "properties": {"version_id": {"type": "integer"}, "train": _FITNESS, "validation": _FITNESS,
                        "test": _FITNESS, "whole_set": _FITNESS}}
REPORT_SCHEMA = {
    "type": "object",
    "description": "The generalization result. With a held-out claim (`held_out`), the search scored individuals on "
                   "the train split, selected the best on validation, and scored base and best once on the test "
                   "split at the end; without one (`reason` says why: a set too small to split), it searched and "
                   "selected on the whole set and makes no claim beyond it. Train and validation are kept up to date "
                   "while the run goes on; `test` is null until the end.",
    "properties": {
        "held_out": {"type": "boolean"},
        "reason": {"type": "string", "description": "Why the set cannot carry a held-out claim (empty when it can)."},
        "selected_on": {"type": "string", "description": "validation (train when the budget ended before any "
                                                         "validation), or whole set without a held-out claim."},
        "splits": {"type": "object", "additionalProperties": {"type": "integer"},
                   "description": "Items per split when the run began."},
        "base": _SIDE, "best": _SIDE,
        "test": {"type": "object", "nullable": True, "properties": {
            "items": {"type": "integer"}, "paired": {"type": "integer", "description": "Test items both were graded "
                                                                                      "on."},
            "lift": {**_FITNESS, "description": "The best's relative fitness gain over the base's on test (0.12 = "
                                                "+12%)."},
            "lift_low": {**_FITNESS, "description": "The lift's 95% interval: the paired bootstrap interval of the "
                                                    "mean per-item score difference, relative to the base's mean score "
                                                    "on test."},
            "lift_high": _FITNESS,
            "comparison": {"type": "object", "description": "The paired test over the test items (evals' "
                                                            "promotion test: Wilcoxon signed-rank p-value, bootstrap "
                                                            "interval of the mean difference, verdict)."},
            "eval_runs": {"type": "object", "properties": {"base": {"type": "integer", "nullable": True},
                                                           "best": {"type": "integer", "nullable": True}}},
            "item_ids": {"type": "array", "items": {"type": "integer"}}}},
        "train_test_gap": {**_FITNESS, "description": "The best's train fitness minus its test fitness."},
        "test_error": {"type": "string", "description": "Why the test split went (partly) unscored."},
    },
}

class EvolutionRunSerializer(serializers.ModelSerializer):
    """A run in a list: where it stands, its counters and what it found (the detail adds its config)."""

    url = serializers.HyperlinkedIdentityField(view_name="evolution-run-detail")
    workflow_url = serializers.SerializerMethodField()
    golden_set_url = serializers.SerializerMethodField()
    # text, not enums: `status` and `mode` enums would collide with other apps' in the schema's component names
    mode = serializers.CharField(read_only=True, help_text=f"One of {', '.join(EvolutionRun.Mode.values)}.")
    status = serializers.CharField(read_only=True, help_text=f"One of {', '.join(EvolutionRun.Status.values)}.")
    paused_at = serializers.CharField(read_only=True, help_text='The generation boundary a paused run waits at '
                                                                '("g2"); empty when it does not wait.')
    stop_reason = serializers.CharField(read_only=True, help_text="Why a completed run stopped (the generations "
                                                                  "done, a budget, convergence...).")
    base_version_url = serializers.SerializerMethodField()
    best_version_url = serializers.SerializerMethodField()
    base_fitness = serializers.FloatField(read_only=True, allow_null=True, help_text="The base's " + FITNESS_HELP)
    best_fitness = serializers.FloatField(read_only=True, allow_null=True, help_text="The best version's "
                                                                                     + FITNESS_HELP)
    lift = serializers.FloatField(read_only=True, allow_null=True,
                                  help_text="The best fitness's relative gain over the base's on the items the search "
                                            "scored (0.12 = +12%); with a held-out claim `test_lift` is the result.")
    held_out = serializers.BooleanField(read_only=True, allow_null=True,
                                        help_text="Whether the run searched on train, selected on validation and "
                                                  "reports on test (null until it begins); `report` says why not.")
    test_lift = serializers.FloatField(read_only=True, allow_null=True,
                                       help_text="The best version's relative gain over the base's on the test split "
                                                 "(the held-out result; null without one).")
    durable_run = serializers.CharField(source="durable_run_id", read_only=True, allow_null=True,
                                        help_text="The id of the durable run that drives it.")
    durable_run_url = serializers.SerializerMethodField()
    generations_url = serializers.SerializerMethodField()
    individuals_url = serializers.SerializerMethodField()
    genealogy_url = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = EvolutionRun
        fields = ["id", "url", "workspace", "workflow", "workflow_url", "golden_set", "golden_set_url", "mode",
                  "status", "paused_at", "stop_reason", "base_version", "base_version_url", "best_version",
                  "best_version_url", "base_fitness", "best_fitness", "lift", "held_out", "test_lift",
                  "generations_done", "evaluations",
                  "rollouts", "cache_hits", "usd_cost", "durable_run", "durable_run_url", "generations_url",
                  "individuals_url", "genealogy_url", "created_by", "created_at", "updated_at", "started_at",
                  "ended_at"]
        read_only_fields = fields

    def _request(self):
        return self.context.get("request")

    def get_workflow_url(self, obj) -> str:
        return _link(self._request(), "workflow-detail", obj.workflow_id)

    def get_golden_set_url(self, obj) -> str:
        return _link(self._request(), "golden-set-detail", obj.golden_set_id)

    def get_base_version_url(self, obj) -> str:
        return _link(self._request(), "workflow-version-detail", obj.base_version_id)

    @extend_schema_field(NULLABLE_URI)
    def get_best_version_url(self, obj) -> str | None:
        return _link(self._request(), "workflow-version-detail", obj.best_version_id)

    @extend_schema_field(NULLABLE_URI)
    def get_durable_run_url(self, obj) -> str | None:
        return _link(self._request(), "durable-run-detail", obj.durable_run_id)

    def get_generations_url(self, obj) -> str:
        return _link(self._request(), "evolution-run-generations", obj.pk)

    def get_individuals_url(self, obj) -> str:
        return _link(self._request(), "evolution-run-individuals", obj.pk)

    def get_genealogy_url(self, obj) -> str:
        return _link(self._request(), "evolution-run-genealogy", obj.pk)


class EvolutionRunDetailSerializer(EvolutionRunSerializer):
    config = serializers.JSONField(read_only=True, help_text="The run's settings, defaults filled in (see the "
                                                             "create operation for each one).")
    goal = serializers.CharField(source="goal_text", read_only=True)
    error = serializers.CharField(read_only=True, help_text="Why a failed or cancelled run ended.")
    report = serializers.SerializerMethodField()

    class Meta(EvolutionRunSerializer.Meta):
        fields = [*EvolutionRunSerializer.Meta.fields, "config", "goal", "error", "report"]
        read_only_fields = fields

    @extend_schema_field(REPORT_SCHEMA)
    def get_report(self, obj) -> dict:
        return obj.report


class EvolutionRunStartSerializer(serializers.Serializer):
    workflow = ScopedPrimaryKeyField(model=Workflow, workspace_field="workspace",
                                     help_text="The workflow to evolve (one of yours).")
    golden_set = golden_set_field(help_text="The golden set each individual is scored on (of the workflow's "
                                            "workspace, with items).")
    mode = serializers.ChoiceField(choices=EvolutionRun.Mode.choices, default=EvolutionRun.Mode.GP,
                                   help_text="gp: a population bred by crossover, mutation and immigrants; "
                                             "reflective: a frontier rewritten from its failures, minibatch first; "
                                             "iterative: one line of judge-guided rewrites.")
    base_version = version_field(required=False, allow_null=True,
                                 help_text="The version to start from (of the workflow). Default: its active "
                                           "version, else its newest version no evolution bred.")
    config = ConfigField(required=False, default=dict)
    goal = serializers.CharField(max_length=GOAL_MAX, required=False, allow_blank=True, default="",
                                 trim_whitespace=False, help_text="What the operators should aim for, in words.")

    def validate(self, attrs):
        workflow, golden_set, base = attrs["workflow"], attrs["golden_set"], attrs.get("base_version")
        errors = {}
        if golden_set.workspace_id != workflow.workspace_id:
            errors["golden_set"] = ["Belongs to another workspace than the workflow."]
        if base is not None and base.workflow_id != workflow.pk:
            errors["base_version"] = ["Is not a version of this workflow."]
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class EvolutionRunCancelSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500, required=False, default="cancelled by an operator")


class PromoteBestRefusedSerializer(serializers.Serializer):
    status = serializers.IntegerField()
    code = serializers.CharField(help_text="promotion_refused (the evidence does not support it) or conflict.")
    message = serializers.CharField()
    evidence = serializers.JSONField(required=False, help_text="When refused: the comparison with the active "
                                                               "version (as golden-sets/{id}/compare/ answers it).")


class PromoteBestRefusedBodySerializer(serializers.Serializer):
    error = PromoteBestRefusedSerializer()


# ------------------------------------------------------------------------------------------ generations

GENERATION_STATS_SCHEMA = {
    "type": "object",
    "additionalProperties": True,
    "description": "The generation's fitness spread over its members (best, avg, worst, stddev; 0-100), its best "
                   "version, the best's gain over the previous generation (improvement) and the run's totals so "
                   "far (run_*).",
    "properties": {
        **{name: {"type": "number", "nullable": True} for name in ("best", "avg", "worst", "stddev", "improvement",
                                                                   "run_best_fitness", "base_fitness",
                                                                   "run_best_validation_fitness",
                                                                   "base_validation_fitness",
                                                                   "evaluations_per_hour")},
        **{name: {"type": "integer", "nullable": True} for name in ("best_version_id", "members",
                                                                    "run_best_version_id", "run_evaluations",
                                                                    "run_rollouts", "run_cache_hits")},
        "run_usd": {"type": "string", "nullable": True, "description": "USD paid by the run so far (decimal)."},
        "selected_on": {"type": "string", "description": (
            "What the run's best was chosen on: validation, train (the budget ended before any validation), or the "
            "search set (no held-out claim).")},
        "run_best_changes": {
            "type": "array", "description": "Each change of the run's best since the previous generation's row, with "
                                            "the run's rollouts when it changed.",
            "items": {"type": "object", "properties": {"version_id": {"type": "integer"},
                                                       "run_rollouts": {"type": "integer"}}}},
    },
}


class GenerationSerializer(serializers.ModelSerializer):
    best_workflow_version_url = serializers.SerializerMethodField()
    stats = serializers.SerializerMethodField()
    individuals_url = serializers.SerializerMethodField(help_text="Its individuals (the run's individuals, "
                                                                  "filtered).")

    class Meta:
        model = Generation
        fields = ["id", "number", "best_workflow_version", "best_workflow_version_url", "stats", "individuals_url",
                  "started_at", "ended_at"]
        read_only_fields = fields

    @extend_schema_field(GENERATION_STATS_SCHEMA)
    def get_stats(self, obj):
        return obj.stats

    @extend_schema_field(NULLABLE_URI)
    def get_best_workflow_version_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "workflow-version-detail", obj.best_workflow_version_id)

    def get_individuals_url(self, obj) -> str:
        return _link(self.context.get("request"), "evolution-run-individuals", obj.evolution_run_id,
                     f"?generation={obj.number}")


class IndividualSerializer(serializers.ModelSerializer):
    generation = serializers.IntegerField(source="generation_number", read_only=True,
                                          help_text="The number of its generation (0 is the first).")
    workflow_version_url = serializers.SerializerMethodField()
    operation = serializers.CharField(read_only=True, help_text="How the version was made (its `operation`).")
    parent1 = serializers.IntegerField(read_only=True, allow_null=True)
    parent2 = serializers.IntegerField(read_only=True, allow_null=True)
    kind = serializers.CharField(read_only=True, help_text='The operator that made it in this run ("base", '
                                                           '"prompt", "tool", "crossover", "immigrant", ...).')
    fitness = serializers.FloatField(read_only=True, allow_null=True, help_text=FITNESS_HELP)
    avg_score = serializers.FloatField(read_only=True, allow_null=True, help_text="Its mean item score (0..1).")
    eval_run_url = serializers.SerializerMethodField()

    class Meta:
        model = Individual
        fields = ["id", "generation", "workflow_version", "workflow_version_url", "operation", "parent1", "parent2",
                  "kind", "note", "fitness", "avg_score", "survived", "eval_run", "eval_run_url"]
        read_only_fields = fields

    def get_workflow_version_url(self, obj) -> str:
        return _link(self.context.get("request"), "workflow-version-detail", obj.workflow_version_id)

    @extend_schema_field(NULLABLE_URI)
    def get_eval_run_url(self, obj) -> str | None:
        return _link(self.context.get("request"), "eval-run-detail", obj.eval_run_id)


# ------------------------------------------------------------------------------------------- genealogy

class GenealogyNodeSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The version's id.")
    generation = serializers.IntegerField(allow_null=True, help_text="The first generation of this run it took "
                                                                     "part in; null for an ancestor that did not.")
    operation = serializers.ChoiceField(choices=WorkflowVersion.Operation.choices)
    fitness = serializers.FloatField(allow_null=True, help_text="Its best fitness in this run (0-100); null for an "
                                                                "ancestor that did not take part.")
    kind = serializers.CharField(allow_blank=True, help_text="The operator that made it in this run (at its first "
                                                             "appearance); empty for an ancestor.")
    is_base = serializers.BooleanField()
    is_best = serializers.BooleanField()
    url = serializers.URLField()


class GenealogyEdgeSerializer(serializers.Serializer):
    source = serializers.IntegerField(help_text="The parent version.")
    target = serializers.IntegerField(help_text="The child version.")
    operation = serializers.ChoiceField(choices=WorkflowVersion.Operation.choices,
                                        help_text="How the child was made from its parent(s).")


class GenealogySerializer(serializers.Serializer):
    nodes = GenealogyNodeSerializer(many=True)
    edges = GenealogyEdgeSerializer(many=True, help_text="Parent to child, between the nodes listed.")
    truncated = serializers.BooleanField(help_text=f"More than {GENEALOGY_MAX_NODES} versions: the run's "
                                                   "individuals come first (oldest first), then their ancestors.")
    node_limit = serializers.IntegerField()


# --------------------------------------------------------------------------------------------- lineage

class LineageRelativeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    depth = serializers.IntegerField(help_text="Generations away (1: a parent or a child).")
    operation = serializers.ChoiceField(choices=WorkflowVersion.Operation.choices)
    generation = serializers.IntegerField(allow_null=True, help_text="The evolution generation that bred it.")
    url = serializers.URLField()


class LineageStepSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    operation = serializers.ChoiceField(choices=WorkflowVersion.Operation.choices)
    parent1 = serializers.IntegerField(allow_null=True)
    parent2 = serializers.IntegerField(allow_null=True)
    fitness = serializers.FloatField(allow_null=True, help_text="Of its latest completed eval run on any golden "
                                                                "set (0-100); null when it has none.")
    fitness_change = serializers.FloatField(allow_null=True, help_text="fitness - the previous step's; null unless "
                                                                       "both are known.")
    eval_run = serializers.IntegerField(allow_null=True, help_text="The eval run the fitness comes from.")
    golden_set = serializers.IntegerField(allow_null=True, help_text="That eval run's golden set.")
    url = serializers.URLField()


class LineageSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    url = serializers.URLField()
    ancestors = LineageRelativeSerializer(many=True, help_text="Through either parent, nearest first.")
    descendants = LineageRelativeSerializer(many=True, help_text="Through either parent, nearest first.")
    path = LineageStepSerializer(many=True, help_text="From its root (a version without a first parent) to this "
                                                      "version, following first parents, oldest first.")
    truncated = serializers.BooleanField(help_text=f"A list was cut at {LINEAGE_MAX_NODES} versions (or "
                                                   f"{LINEAGE_MAX_DEPTH} generations).")
