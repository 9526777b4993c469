"""The 7 canonical agents (docs/canonical-agents.md), seeded as workflows with their golden sets.

Each agent is one YAML file in ``evals/agents/``: its workflow (name, description), its base DSL with
the JSON output schema, the model tier and temperature of the reference, and its golden set (graders,
pass threshold, items). ``seed_agents`` writes them into a workspace (``manage.py seed_agents``, and
the demo seed of ``make run``).

The file format (``load_agents`` checks it and raises ``AgentFileError`` naming the file and field)::

    name: Research Analyst                # the workflow's name (unique in a workspace)
    description: ...                      # the workflow's description
    template: research-report             # the skill pack entry the agent is built around
    tier: sonnet                          # haiku | sonnet: the model class (LLM_MODEL_TIERS)
    temperature: 0.2                      # the reference's temperature (recorded in the DSL's `agent`)
    commit_message: ...                   # the base version's commit message
    dsl: {entryNodeId, inputSchema, outputSchema, nodes: [...]}   # the workflow DSL; a node without a
                                          # model gets the tier's; a node written {nodeId: x, from:
                                          # other.yaml} is that agent's entry node (the General
                                          # Assistant's specialists); `agent` is filled in
    golden_set:
      description: ...
      pass_threshold: 0.7
      graders: [{kind: json_fields, weight: 1, fields: [...]}, ...]   # evals/graders/guide.md
      scoring_criteria: ...               # the items' default criteria and rubric (for an LLM judge)
      rubric: [{criterion: ..., max_points: 2}]
      items:
        - key: stable-key                 # kept in the item's metadata["key"]: how a re-seed finds it
          input: {text: ...}
          expected_output: {...} or "..." # an object is stored as its JSON text
          scoring_criteria: ...
          rubric: [{criterion: ..., max_points: 2}]
          tags: [critical]

The DSL's top-level ``agent`` ({template, modelTier, temperature}) records the reference's settings with
the genome; the runner does not read it (it calls models at temperature 0).

Idempotent, like ``seed_skills``:

- The same DSL is the same version (content addressing), so an unchanged agent writes nothing.
- A changed DSL becomes a new version (operation ``init``, parent the previous seeded base). It is
  activated only when the workflow has no active version, or when the active one is an earlier base
  written by this seed (its commit message starts with ``SEED_MARK``) that no promotion or rollback
  made active; a file reverted to an earlier base re-activates that base the same way. Over a version
  an operator chose (promoted, rolled back to, or written by hand or by evolution) the new base stays
  a candidate for the operator to evaluate and promote.
- Golden items are matched by ``metadata["key"]`` and updated in place when their contents, tags or
  position changed (an updated item's earlier results are no longer reused: its content hash moved).
  With ``prune``, seeded items (those with a key) whose key is no longer in the file are deleted with
  their results; items an operator added by hand (no key) are never pruned.
- The set's graders, pass threshold, description and workflow follow the file.
- Everything is checked before anything is written, and written in one transaction.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from django.db import transaction

AGENTS_DIR = Path(__file__).resolve().parent / "agents"
SEED_MARK = "seed_agents:"
TIERS = ("haiku", "sonnet")  # the model classes of the reference


def model_tiers() -> dict[str, str]:
    """The model each tier stands for on this installation (LLM_MODEL_TIERS; without a key the offline
    model answers them whatever they are)."""
    from django.conf import settings

    return {tier: settings.LLM_MODEL_TIERS.get(tier) or settings.LLM_DEFAULT_MODEL for tier in TIERS}


REQUIRED_FIELDS = ("name", "description", "template", "tier", "temperature", "commit_message", "dsl", "golden_set")
ITEM_FIELDS = ("key", "input", "expected_output", "scoring_criteria", "rubric", "tags")


class AgentFileError(ValueError):
    """An agent file that cannot be seeded; the message names the file and the field."""


@dataclass(frozen=True)
class AgentItem:
    key: str
    input: object
    expected_output: str
    scoring_criteria: str = ""
    rubric: tuple = ()
    tags: tuple = ()


@dataclass(frozen=True)
class AgentSpec:
    """One canonical agent as its file describes it (the DSL with models and `agent` filled in)."""

    path: Path
    name: str
    description: str
    template: str
    tier: str
    temperature: float
    commit_message: str
    dsl: dict
    set_name: str
    set_description: str
    pass_threshold: float
    graders: list
    items: tuple[AgentItem, ...]

    @property
    def output_schema(self) -> dict:
        return self.dsl.get("outputSchema") or {}


# the reference's order (docs/canonical-agents.md); other files follow by name
CANONICAL = ("general-assistant", "research-analyst", "code-review-agent", "data-analyst", "content-strategist",
             "meeting-summarizer", "bug-triage-assistant")


def agent_files(root: Path | None = None) -> list[Path]:
    """The agent files of `root`, the canonical ones in the reference's order first."""
    order = {stem: index for index, stem in enumerate(CANONICAL)}
    return sorted(Path(root or AGENTS_DIR).glob("*.yaml"), key=lambda path: (order.get(path.stem, len(order)),
                                                                             path.name))


def _read(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise AgentFileError(f"{path.name}: cannot be read as YAML: {exc}") from None
    if not isinstance(data, dict):
        raise AgentFileError(f"{path.name}: must be a mapping")
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        raise AgentFileError(f"{path.name}: missing {', '.join(missing)}")
    if data["tier"] not in TIERS:
        raise AgentFileError(f"{path.name}: tier must be one of {', '.join(TIERS)}, not {data['tier']!r}")
    if not isinstance(data["dsl"], dict) or not isinstance(data["dsl"].get("nodes"), list):
        raise AgentFileError(f"{path.name}: dsl must be a workflow DSL with nodes")
    return data


def _with_model(node: dict, tier: str) -> dict:
    node = copy.deepcopy(node)
    if not (node.get("gatewayModelId") or node.get("modelName")):
        node["gatewayModelId"] = model_tiers()[tier]
    return node


def _borrowed_node(path: Path, entry: dict) -> dict:
    """A node written as `{nodeId, from: other-agent.yaml, ...overrides}`: the other agent's entry node
    (its prompt, tools, skills and tier model), renamed, with the overrides applied."""
    source = path.parent / str(entry["from"])
    other = _read(source)
    nodes = other["dsl"]["nodes"]
    node = next((n for n in nodes if isinstance(n, dict) and n.get("nodeId") == other["dsl"].get("entryNodeId")),
                None)
    if node is None or "from" in node:
        raise AgentFileError(f"{path.name}: node {entry.get('nodeId')!r} borrows from {source.name}, "
                             f"whose entry node cannot be borrowed")
    return {**_with_model(node, other["tier"]), **{k: v for k, v in entry.items() if k != "from"}}


def load_agent(path: Path) -> AgentSpec:
    """Read and check one agent file."""
    data = _read(path)
    dsl = copy.deepcopy(data["dsl"])
    dsl["nodes"] = [_borrowed_node(path, node) if isinstance(node, dict) and "from" in node
                    else _with_model(node, data["tier"]) for node in dsl["nodes"]]
    dsl["agent"] = {"template": data["template"], "modelTier": f"{data['tier']}-class",
                    "temperature": float(data["temperature"])}
    golden = data["golden_set"]
    if not isinstance(golden, dict) or not isinstance(golden.get("items"), list):
        raise AgentFileError(f"{path.name}: golden_set must have items")
    items, keys = [], set()
    for index, raw in enumerate(golden["items"]):
        where = f"{path.name}: golden_set.items[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("key"), str) or not raw["key"]:
            raise AgentFileError(f"{where}: needs a key")
        unknown = set(raw) - set(ITEM_FIELDS)
        if unknown:
            raise AgentFileError(f"{where}: unknown fields {', '.join(sorted(unknown))}")
        if raw["key"] in keys:
            raise AgentFileError(f"{where}: duplicate key {raw['key']!r}")
        keys.add(raw["key"])
        expected = raw.get("expected_output", "")
        if not isinstance(expected, str):
            expected = json.dumps(expected, ensure_ascii=False)
        items.append(AgentItem(key=raw["key"], input=raw.get("input"), expected_output=expected,
                               scoring_criteria=raw.get("scoring_criteria") or golden.get("scoring_criteria") or "",
                               rubric=tuple(raw.get("rubric") or golden.get("rubric") or ()),
                               tags=tuple(raw.get("tags") or ())))
    return AgentSpec(
        path=path, name=data["name"], description=data["description"], template=data["template"],
        tier=data["tier"], temperature=float(data["temperature"]), commit_message=data["commit_message"], dsl=dsl,
        set_name=golden.get("name") or f"{data['name']} golden set", set_description=golden.get("description", ""),
        pass_threshold=float(golden.get("pass_threshold", 0.7)), graders=list(golden.get("graders") or []),
        items=tuple(items))


def load_agents(root: Path | None = None) -> list[AgentSpec]:
    """Every agent file of `root` (default: the canonical agents Lineage ships), see agent_files."""
    return [load_agent(path) for path in agent_files(root)]


# --------------------------------------------------------------------------------------------- seeding

@dataclass
class AgentOutcome:
    """What seeding one agent did."""

    name: str
    workflow: str = "unchanged"  # created | updated (a new active or candidate version, or description) | unchanged
    version_id: int | None = None
    version_status: str = ""
    note: str = ""
    golden_set: str = "unchanged"  # created | updated | unchanged
    items_added: int = 0
    items_updated: int = 0
    items_removed: int = 0
    items_unchanged: int = 0

    @property
    def changed(self) -> bool:
        return (self.workflow != "unchanged" or self.golden_set != "unchanged"
                or any((self.items_added, self.items_updated, self.items_removed)))

    def line(self) -> str:
        version = f"version {self.version_id} {self.version_status}" + (f" ({self.note})" if self.note else "")
        return (f"{self.name}: workflow {self.workflow}, {version}; golden set {self.golden_set}: "
                f"{self.items_added} added, {self.items_updated} updated, {self.items_removed} removed, "
                f"{self.items_unchanged} unchanged")


@dataclass
class AgentsReport:
    workspace: str
    agents: list[AgentOutcome] = field(default_factory=list)
    missing_skills: list[str] = field(default_factory=list)  # named by a node, no active version in the workspace

    @property
    def changed(self) -> bool:
        return any(outcome.changed for outcome in self.agents)


def seed_agents(*, workspace, prune: bool = False, root: Path | None = None) -> AgentsReport:
    """Write the canonical agents (workflows, base versions, golden sets) into `workspace`; see the
    module docstring for what is created, updated, activated and pruned. Nothing is written when a
    file is invalid: AgentFileError (format), DslError (its DSL) or EvalError (its golden set)."""
    specs = load_agents(root)
    for spec in specs:
        check_agent(spec)
    report = AgentsReport(workspace=workspace.slug)
    with transaction.atomic():
        for spec in specs:
            report.agents.append(_seed_agent(workspace, spec, prune=prune))
    report.missing_skills = _missing_skills(workspace, specs)
    return report


def check_agent(spec: AgentSpec) -> None:
    """Raise DslError or EvalError (naming the agent) when `spec` cannot be seeded."""
    from evals.graders import GraderConfigError, validate_graders
    from evals.services import EvalError, item_errors
    from workflows.dsl import DslError, parse

    try:
        parse(spec.dsl)
    except DslError as exc:
        raise DslError({f"{spec.path.name}: {path}": messages for path, messages in exc.errors.items()}) from None
    errors: dict[str, list[str]] = {}
    try:
        validate_graders(spec.graders)
    except GraderConfigError as exc:
        errors.update({f"{spec.path.name}: golden_set.{path}": messages for path, messages in exc.errors.items()})
    for item in spec.items:
        problems = item_errors(input=item.input, expected_output=item.expected_output,
                               scoring_criteria=item.scoring_criteria, rubric=list(item.rubric),
                               tags=list(item.tags), metadata={})
        errors.update({f"{spec.path.name}: golden_set.items[{item.key}].{name}": messages
                       for name, messages in problems.items()})
    if errors:
        raise EvalError(errors)


def _missing_skills(workspace, specs: list[AgentSpec]) -> list[str]:
    from knowledge.models import Skill

    named = {skill for spec in specs for node in spec.dsl["nodes"] for skill in node.get("skills") or ()}
    active = set(Skill.objects.filter(workspace=workspace, active=True, name__in=named).values_list("name", flat=True))
    return sorted(named - active)


def _seed_agent(workspace, spec: AgentSpec, *, prune: bool) -> AgentOutcome:
    from workflows.models import Workflow

    outcome = AgentOutcome(name=spec.name)
    workflow = Workflow.objects.select_for_update().filter(workspace=workspace, name=spec.name).first()
    if workflow is None:
        from workflows.services import workflow_create

        workflow = workflow_create(workspace=workspace, name=spec.name, description=spec.description)
        outcome.workflow = "created"
    elif workflow.description != spec.description:
        workflow.description = spec.description
        workflow.save(update_fields=["description", "updated_at"])
        outcome.workflow = "updated"
    _seed_version(workflow, spec, outcome)
    _seed_golden_set(workspace, workflow, spec, outcome, prune=prune)
    return outcome


def _seed_version(workflow, spec: AgentSpec, outcome: AgentOutcome) -> None:
    from evals.models import Promotion
    from workflows.models import WorkflowVersion
    from workflows.services import workflow_version_activate, workflow_version_create

    active = WorkflowVersion.objects.filter(workflow=workflow, status=WorkflowVersion.Status.ACTIVE).first()
    previous = WorkflowVersion.objects.filter(workflow=workflow, operation=WorkflowVersion.Operation.INIT,
                                              commit_message__startswith=SEED_MARK).order_by("-pk").first()
    version, created = workflow_version_create(
        workflow=workflow, dsl=spec.dsl, operation=WorkflowVersion.Operation.INIT,
        parents=(previous,) if previous is not None else (), commit_message=f"{SEED_MARK} {spec.commit_message}")
    if created and outcome.workflow == "unchanged":
        outcome.workflow = "updated"
    if active is None:
        workflow_version_activate(version=version)
    elif active.pk != version.pk:
        seeded = (active.operation == WorkflowVersion.Operation.INIT
                  and active.commit_message.startswith(SEED_MARK)
                  and not Promotion.objects.filter(workflow_version=active).exists())
        if seeded:  # the file changed (or was reverted to an earlier base): the seed's own choice moves with it
            workflow_version_activate(version=version)
            outcome.note = f"replaces the earlier seeded base {active.pk}"
            if outcome.workflow == "unchanged":
                outcome.workflow = "updated"
        else:
            outcome.note = f"the active version {active.pk} was chosen by an operator and stays active"
    version.refresh_from_db(fields=["status"])
    outcome.version_id, outcome.version_status = version.pk, version.status


def _seed_golden_set(workspace, workflow, spec: AgentSpec, outcome: AgentOutcome, *, prune: bool) -> None:
    from evals.graders import validate_graders
    from evals.models import GoldenItem, GoldenSet
    from evals.services import golden_item_add, golden_set_create

    golden = GoldenSet.objects.select_for_update().filter(workspace=workspace, name=spec.set_name).first()
    if golden is None:
        golden = golden_set_create(workspace=workspace, name=spec.set_name, workflow=workflow,
                                   description=spec.set_description, graders=spec.graders,
                                   pass_threshold=spec.pass_threshold)
        outcome.golden_set = "created"
    else:
        wanted = {"workflow_id": workflow.pk, "description": spec.set_description,
                  "graders": validate_graders(spec.graders), "pass_threshold": spec.pass_threshold}
        changed = [name for name, value in wanted.items() if getattr(golden, name) != value]
        if changed:
            for name in changed:
                setattr(golden, name, wanted[name])
            golden.save(update_fields=[*changed, "updated_at"])
            outcome.golden_set = "updated"
    existing = {item.metadata.get("key"): item for item in GoldenItem.objects.filter(golden_set=golden)
                if isinstance(item.metadata, dict) and item.metadata.get("key")}
    for position, spec_item in enumerate(spec.items, 1):
        values = {"input": spec_item.input, "expected_output": spec_item.expected_output,
                  "scoring_criteria": spec_item.scoring_criteria, "rubric": list(spec_item.rubric),
                  "tags": list(spec_item.tags), "position": position}
        item = existing.get(spec_item.key)
        if item is None:
            golden_item_add(golden_set=golden, metadata={"key": spec_item.key, "seeded_by": "seed_agents"},
                            **values)
            outcome.items_added += 1
            continue
        changed = [name for name, value in values.items() if getattr(item, name) != value]
        if not changed:
            outcome.items_unchanged += 1
            continue
        for name in changed:
            setattr(item, name, values[name])
        item.save(update_fields=[*changed, "updated_at"])
        outcome.items_updated += 1
    if prune:
        stale = [item.pk for key, item in existing.items() if key not in {i.key for i in spec.items}]
        if stale:
            GoldenItem.objects.filter(pk__in=stale).delete()
            outcome.items_removed = len(stale)
