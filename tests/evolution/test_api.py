"""The evolution API: start a run (202, driven in-process here), pause, resume, cancel, promote its best; its
generations, individuals and genealogy; a version's lineage; scoping, refusals and query budgets."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import resolve

from durable.inprocess import run_until_settled
from evals.models import EvalRun, Promotion
from evals.services import golden_item_add, golden_set_create
from evolution.api import views
from evolution.conf import DEFAULTS, LIMITS
from evolution.models import EvolutionRun, Generation, Individual
from tests.builders import graph, node
from tests.evals.conftest import support_versions  # noqa: F401  (shared fixture)
from tests.factories import MembershipFactory, UserFactory, WorkspaceFactory
from workflows.models import WorkflowVersion
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create
from workspaces.models import Membership

pytestmark = pytest.mark.django_db

RUNS = "/api/evolution-runs/"
VERSIONS = "/api/workflow-versions/"
SMALL = {"population": 3, "generations": 2, "seed": 1}


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Runs started here are driven in-process (or left pending): no worker listens."""
    settings.DURABLE_DISPATCH_ENABLED = False


def error_of(response, status=400) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:3000])
    return response.json()["error"]


def _count(client, url, params=None):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params or {})
    assert response.status_code == 200, response.content[:2000]
    return len(queries), response


def new_version(workspace, name="flow", prompt="Answer.", **kwargs) -> WorkflowVersion:
    workflow = workflow_create(workspace=workspace, name=name)
    version, _ = workflow_version_create(workflow=workflow, dsl=graph("a", node("a", prompt=prompt)), **kwargs)
    return version


def child_of(*parents, prompt: str, operation="mutation", generation=None) -> WorkflowVersion:
    version, _ = workflow_version_create(workflow=parents[0].workflow, dsl=graph("a", node("a", prompt=prompt)),
                                         parents=parents, operation=operation, generation=generation)
    return version


def make_set(workspace, name="set", items=1):
    golden = golden_set_create(workspace=workspace, name=name, graders=[{"kind": "contains"}])
    for index in range(items):
        golden_item_add(golden_set=golden, input={"text": f"q{index}"}, expected_output=f"a{index}")
    return golden


def make_run(golden, base, **fields) -> EvolutionRun:
    """An evolution run row written directly (no durable run): for reads, refusals and query budgets."""
    return EvolutionRun.objects.create(workspace_id=golden.workspace_id, workflow=base.workflow, golden_set=golden,
                                       base_version=base, config=dict(DEFAULTS), **fields)


def add_individual(run, number, version, fitness, kind="prompt", eval_run=None, survived=True) -> Individual:
    generation, _ = Generation.objects.get_or_create(evolution_run=run, number=number,
                                                     defaults={"stats": {"best": fitness, "avg": fitness}})
    return Individual.objects.create(evolution_run=run, generation=generation, workflow_version=version,
                                     kind=kind, fitness=fitness, avg_score=fitness / 100, survived=survived,
                                     eval_run=eval_run)


def start(client, workflow, golden, **body):
    return client.post(RUNS, {"workflow": workflow.pk, "golden_set": golden.pk, **body}, format="json")


# ------------------------------------------------------------------------------------------ a whole run

def test_a_run_started_through_the_api_completes_and_its_generations_individuals_and_genealogy_read_back(
        api_as, owner, facts, support_set, support_base):
    client = api_as(owner)
    response = start(client, support_base.workflow, support_set, config=SMALL, goal="cite the policy")
    assert response.status_code == 202, response.content
    started = response.json()
    assert started["status"] == "queued" and started["mode"] == "gp" and started["goal"] == "cite the policy"
    assert started["config"] == {**DEFAULTS, **SMALL} and started["base_version"] == support_base.pk
    assert started["durable_run"] == f"evo-{started['id']}"
    assert started["durable_run_url"].endswith(f"/api/durable/runs/{started['durable_run']}/")
    assert client.get(started["durable_run_url"]).status_code == 200

    run_until_settled(started["durable_run"], max_wait=300)
    detail = client.get(started["url"]).json()
    run = EvolutionRun.objects.get(pk=started["id"])
    assert detail["status"] == "completed", detail["error"]
    assert detail["stop_reason"] == "2 generations done" and detail["generations_done"] == 2
    assert detail["best_fitness"] == run.best_fitness and detail["base_fitness"] == run.base_fitness
    assert detail["lift"] == pytest.approx(run.lift) and detail["lift"] > 0
    assert detail["evaluations"] == run.evaluations > 0 and detail["rollouts"] == run.rollouts
    assert detail["best_version"] == run.best_version_id != support_base.pk
    assert detail["best_version_url"].endswith(f"{VERSIONS}{run.best_version_id}/")
    assert detail["base_version_url"].endswith(f"{VERSIONS}{support_base.pk}/")

    generations = client.get(detail["generations_url"]).json()["results"]
    assert [g["number"] for g in generations] == [0, 1]
    assert all(g["stats"]["best"] >= g["stats"]["avg"] >= g["stats"]["worst"] for g in generations)
    assert generations[1]["stats"]["improvement"] is not None
    assert client.get(generations[0]["best_workflow_version_url"]).status_code == 200

    first = client.get(generations[0]["individuals_url"]).json()["results"]
    expected = Individual.objects.filter(generation__evolution_run=run, generation__number=0)
    assert sorted(i["workflow_version"] for i in first) == sorted(expected.values_list("workflow_version_id",
                                                                                        flat=True))
    base = next(i for i in first if i["kind"] == "base")
    assert base["workflow_version"] == support_base.pk and base["generation"] == 0 and base["operation"] == "init"
    assert all(i["fitness"] is not None and i["eval_run"] for i in first)
    assert client.get(base["eval_run_url"]).json()["workflow_version"] == support_base.pk
    everyone = client.get(detail["individuals_url"], {"page_size": 200}).json()["results"]
    assert len(everyone) == Individual.objects.filter(evolution_run=run).count()
    assert {i["generation"] for i in client.get(detail["individuals_url"], {"generation": 1}).json()["results"]} \
        == {1}
    survivors = client.get(detail["individuals_url"], {"survived": "true"}).json()["results"]
    assert survivors and all(i["survived"] for i in survivors)

    genealogy = client.get(detail["genealogy_url"]).json()
    nodes = {n["id"]: n for n in genealogy["nodes"]}
    took_part = set(Individual.objects.filter(evolution_run=run).values_list("workflow_version_id", flat=True))
    assert took_part <= set(nodes) and not genealogy["truncated"]
    assert nodes[support_base.pk]["is_base"] and nodes[run.best_version_id]["is_best"]
    assert nodes[run.best_version_id]["fitness"] == run.best_fitness
    for version in WorkflowVersion.objects.filter(pk__in=nodes):
        parents = {p for p in (version.parent1_id, version.parent2_id) if p in nodes}
        if version.pk != support_base.pk:
            assert {e["source"] for e in genealogy["edges"] if e["target"] == version.pk} == parents
    assert {e["operation"] for e in genealogy["edges"]} <= {"mutation", "crossover"}

    # the best version's lineage goes back to the base, each step with its fitness on the run's golden set
    lineage = client.get(f"{VERSIONS}{run.best_version_id}/lineage/").json()
    assert lineage["path"][-1]["id"] == run.best_version_id
    assert support_base.pk in {a["id"] for a in lineage["ancestors"]}
    assert lineage["path"][0]["id"] == support_base.pk and lineage["path"][0]["fitness_change"] is None
    assert lineage["path"][-1]["fitness"] == run.best_fitness
    assert run.best_version_id in {d["id"] for d in client.get(f"{VERSIONS}{support_base.pk}/lineage/").json()[
        "descendants"]}

    # a set too small to split: the run says it makes no held-out claim
    assert detail["held_out"] is False and detail["test_lift"] is None
    assert detail["report"] == run.report and "6 items" in detail["report"]["reason"]
    listed = next(r for r in client.get(RUNS).json()["results"] if r["id"] == run.pk)
    assert listed["held_out"] is False and "report" not in listed

    # its best is not promoted on the search's own measurements; a fresh eval run of the whole set backs it, and
    # with no version active yet the best is promoted on it; again, it is already active
    refused = error_of(client.post(f"{detail['url']}promote-best/"), 409)
    assert refused["message"].startswith("report: the run has no held-out claim: its best was selected on the items")
    fresh = client.post("/api/eval-runs/", {"golden_set": support_set.pk, "workflow_version": run.best_version_id,
                                            "reuse": False}, format="json")
    assert fresh.status_code == 202, fresh.content
    run_until_settled(fresh.json()["durable_run"], max_wait=120)
    promoted = client.post(f"{detail['url']}promote-best/")
    assert promoted.status_code == 200, promoted.content
    assert promoted.json()["workflow_version"] == run.best_version_id and promoted.json()["action"] == "promote"
    assert WorkflowVersion.objects.get(pk=run.best_version_id).status == "active"
    again = error_of(client.post(f"{detail['url']}promote-best/"), 409)
    assert again["message"] == "workflow_version: is already the active version" and "evidence" not in again


def test_pause_takes_effect_at_a_boundary_then_resume_and_cancel_answer_200_or_409(api_as, owner, facts,
                                                                                   support_set, support_base):
    client = api_as(owner)
    run = start(client, support_base.workflow, support_set, config=SMALL).json()
    url = run["url"]
    paused = client.post(f"{url}pause/")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    assert error_of(client.post(f"{url}pause/"), 409)["message"] == \
        f"Evolution run {run['id']}: status: a paused run cannot be paused."
    run_until_settled(run["durable_run"], max_wait=300)
    waiting = client.get(url).json()
    assert waiting["status"] == "paused" and waiting["paused_at"] == "g1" and waiting["generations_done"] == 1
    resumed = client.post(f"{url}resume/")
    assert resumed.status_code == 200 and resumed.json()["status"] == "running" and resumed.json()["paused_at"] == ""
    assert error_of(client.post(f"{url}resume/"), 409)["code"] == "conflict"
    cancelled = client.post(f"{url}cancel/", {"reason": "enough"}, format="json")
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["error"] == "enough"
    for verb in ("cancel", "pause", "resume"):
        assert "cancelled" in error_of(client.post(f"{url}{verb}/"), 409)["message"], verb
    assert error_of(client.post(f"{url}cancel/", {"reason": "x" * 501}, format="json"))["fields"].keys() == {
        "reason"}


def test_promote_best_refused_is_409_with_the_evidence_and_a_better_best_is_promoted(
        api_as, owner, workspace, facts, support_set, support_versions, evaluate):  # noqa: F811
    client = api_as(owner)
    base, better = support_versions
    ended = datetime.now(UTC) - timedelta(hours=1)
    for version in (base, better):  # fresh eval runs of the whole set, after the runs below ended
        assert evaluate(support_set, version, reuse=False).status == "completed"
    workflow_version_activate(version=better)
    worse_best = make_run(support_set, base, status=EvolutionRun.Status.COMPLETED, best_version=base, ended_at=ended)
    refused = client.post(f"{RUNS}{worse_best.pk}/promote-best/")
    error = error_of(refused, 409)
    assert error["code"] == "promotion_refused" and error["message"].startswith("promotion: ")
    assert error["evidence"]["comparison"]["verdict"] != "better" and error["evidence"]["version_b"] == base.pk
    assert WorkflowVersion.objects.get(pk=better.pk).status == "active"

    workflow_version_activate(version=base)
    better_best = make_run(support_set, base, status=EvolutionRun.Status.COMPLETED, best_version=better,
                           ended_at=ended)
    promoted = client.post(f"{RUNS}{better_best.pk}/promote-best/")
    assert promoted.status_code == 200, promoted.content
    body = promoted.json()
    assert body["workflow_version"] == better.pk and body["previous_version"] == base.pk
    assert body["evidence"]["comparison"]["verdict"] == "better"
    assert Promotion.objects.filter(workflow_version=better).count() == 1

    nothing_yet = make_run(support_set, base)
    assert error_of(client.post(f"{RUNS}{nothing_yet.pk}/promote-best/"), 409)["message"] == \
        "best_version: the run has no best version yet"


# --------------------------------------------------------------------------------------------- refusals

@pytest.mark.parametrize(("body", "field"), [
    ({"config": {"population": 1}}, "config.population"),
    ({"config": {"population": 3.5}}, "config.population"),
    ({"config": {"population": "8"}}, "config.population"),
    ({"config": {"populace": 8}}, "config.populace"),
    ({"config": {"population": 3, "elites": 3}}, "config.elites"),
    ({"config": {"crossover_rate": 0.8, "mutation_rate": 0.5}}, "config.mutation_rate"),
    ({"config": {"mutation_weights": {"bogus": 1}}}, "config.mutation_weights"),
    ({"config": {"mutation_weights": {"prompt": 0}}}, "config.mutation_weights"),
    ({"config": {"seed": 2**63}}, "config.seed"),
    ({"config": {"usd_budget": True}}, "config.usd_budget"),
    ({"config": [1, 2]}, "config"),
    ({"config": "population=3"}, "config"),
    ({"config": None}, "config"),
    ({"mode": "lamarckian"}, "mode"),
    ({"goal": "x" * 10_001}, "goal"),
    ({"workflow": None}, "workflow"),
    ({"workflow": "abc"}, "workflow"),
    ({"golden_set": 2**40}, "golden_set"),
    ({"base_version": -1}, "base_version"),
])
def test_a_refused_start_is_a_400_naming_the_field(api_as, owner, workspace, body, field):
    golden, version = make_set(workspace), new_version(workspace)
    response = api_as(owner).post(RUNS, {"workflow": version.workflow_id, "golden_set": golden.pk, **body},
                                  format="json")
    error = error_of(response)
    assert list(error["fields"]) == [field], error
    assert error["message"].startswith(f"{field}: ")
    assert not EvolutionRun.objects.exists()


def test_a_run_uses_a_workflow_golden_set_and_base_version_of_one_workspace(api_as, owner, workspace, outsider,
                                                                            other_workspace):
    client = api_as(owner)
    golden, version = make_set(workspace), new_version(workspace)
    empty = make_set(workspace, name="empty", items=0)
    sibling = new_version(workspace, name="sibling")
    # the owner belongs to a second workspace: its rows are theirs to use, but not in one run with these
    second = WorkspaceFactory(name="Second", slug="second")
    MembershipFactory(user=owner, workspace=second, role=Membership.Role.OWNER)
    second_set, second_version = make_set(second, name="second"), new_version(second, name="second")
    theirs_set, theirs_version = make_set(other_workspace, name="theirs"), new_version(other_workspace, "theirs")
    cases = [
        ({"golden_set": second_set.pk}, {"golden_set": ["Belongs to another workspace than the workflow."]}),
        ({"base_version": second_version.pk}, {"base_version": ["Is not a version of this workflow."]}),
        ({"base_version": sibling.pk}, {"base_version": ["Is not a version of this workflow."]}),
        ({"golden_set": empty.pk}, {"golden_set": ["has no items"]}),
        ({"golden_set": theirs_set.pk}, {"golden_set": [f'Invalid pk "{theirs_set.pk}" - object does not exist.']}),
        ({"workflow": theirs_version.workflow_id},
         {"workflow": [f'Invalid pk "{theirs_version.workflow_id}" - object does not exist.']}),
        ({"base_version": theirs_version.pk},
         {"base_version": [f'Invalid pk "{theirs_version.pk}" - object does not exist.']}),
    ]
    for changes, fields in cases:
        body = {"workflow": version.workflow_id, "golden_set": golden.pk, **changes}
        assert error_of(client.post(RUNS, body, format="json"))["fields"] == fields, changes
    assert not EvolutionRun.objects.exists()
    ok = client.post(RUNS, {"workflow": version.workflow_id, "golden_set": golden.pk, "base_version": version.pk,
                            "config": {"population": 3, "generations": 1}}, format="json")
    assert ok.status_code == 202 and ok.json()["base_version"] == version.pk


def test_a_base_that_cannot_run_here_is_refused_naming_it(api_as, owner, workspace):
    golden = make_set(workspace)
    workflow = workflow_create(workspace=workspace, name="needs tools")
    workflow_version_create(workflow=workflow, dsl=graph("a", node("a", tools=["no_such_tool"])))
    error = error_of(api_as(owner).post(RUNS, {"workflow": workflow.pk, "golden_set": golden.pk}, format="json"))
    assert list(error["fields"]) == ["base_version.tools"] and "no_such_tool" in error["message"]


# ---------------------------------------------------------------------------------------------- scoping

@pytest.fixture
def theirs(other_workspace, outsider):
    """The outsider's run (a generation with an individual) and version."""
    golden, version = make_set(other_workspace, name="globex set"), new_version(other_workspace, name="globex flow")
    run = make_run(golden, version, goal_text="globex secret", best_version=version)
    add_individual(run, 0, version, 50.0, kind="base")
    return {"run": run, "version": version, "set": golden}


def test_another_workspaces_runs_and_versions_are_404_and_never_listed(api_as, owner, workspace, theirs):
    client = api_as(owner)
    r, v = theirs["run"].pk, theirs["version"].pk
    for url in (f"{RUNS}{r}/", f"{RUNS}{r}/generations/", f"{RUNS}{r}/individuals/", f"{RUNS}{r}/genealogy/",
                f"{VERSIONS}{v}/lineage/"):
        assert error_of(client.get(url), 404)["code"] == "not_found", url
    for verb in ("pause", "resume", "cancel", "promote-best"):
        assert error_of(client.post(f"{RUNS}{r}/{verb}/", {}, format="json"), 404)["code"] == "not_found", verb
    assert client.get(RUNS).json()["results"] == []
    for params in ({"workflow": theirs["version"].workflow_id}, {"golden_set": theirs["set"].pk},
                   {"workspace": theirs["set"].workspace_id}):
        assert list(error_of(client.get(RUNS, params))["fields"]) == list(params), params
    assert EvolutionRun.objects.get(pk=r).status == "queued"


@pytest.mark.parametrize("suffix", ["abc", "99999999999999999999", "-1", "1.5", "%20"])
def test_a_malformed_or_huge_id_is_404(api_as, owner, suffix):
    client = api_as(owner)
    for url in (f"{RUNS}{suffix}/", f"{RUNS}{suffix}/generations/", f"{RUNS}{suffix}/individuals/",
                f"{RUNS}{suffix}/genealogy/", f"{VERSIONS}{suffix}/lineage/"):
        assert client.get(url).status_code == 404, url
    for verb in ("pause", "resume", "cancel", "promote-best"):
        assert client.post(f"{RUNS}{suffix}/{verb}/", {}, format="json").status_code == 404, verb


def test_any_member_writes_and_the_write_role_is_checked_on_every_write(api_as, workspace, monkeypatch):
    member = UserFactory(username="plain")
    MembershipFactory(user=member, workspace=workspace, role=Membership.Role.MEMBER)
    client = api_as(member)
    golden, version = make_set(workspace), new_version(workspace)
    run = make_run(golden, version, best_version=version)
    monkeypatch.setattr(views.EvolutionRunViewSet, "write_roles", Membership.Role.MANAGERS)
    writes = [(RUNS, {"workflow": version.workflow_id, "golden_set": golden.pk}),
              *((f"{RUNS}{run.pk}/{verb}/", {}) for verb in ("pause", "resume", "cancel", "promote-best"))]
    for url, body in writes:
        assert error_of(client.post(url, body, format="json"), 403)["code"] == "permission_denied", url
    for url in (f"{RUNS}{run.pk}/", f"{RUNS}{run.pk}/generations/", f"{RUNS}{run.pk}/genealogy/"):
        assert client.get(url).status_code == 200, url
    assert EvolutionRun.objects.get().status == "queued"


def test_bad_query_parameters_are_400_naming_them(api_as, owner, workspace):
    client = api_as(owner)
    golden, version = make_set(workspace), new_version(workspace)
    run = make_run(golden, version)
    for url, params in [(RUNS, {"status": "sleeping"}), (RUNS, {"mode": "lamarckian"}), (RUNS, {"workflow": "x"}),
                        (f"{RUNS}{run.pk}/individuals/", {"generation": "x"}),
                        (f"{RUNS}{run.pk}/individuals/", {"generation": "-1"}),
                        (f"{RUNS}{run.pk}/individuals/", {"generation": str(2**40)}),
                        (f"{RUNS}{run.pk}/individuals/", {"survived": "maybe"}),
                        (f"{RUNS}{run.pk}/individuals/", {"kind": "k" * 31})]:
        assert list(error_of(client.get(url, params))["fields"]) == list(params), (url, params)


def test_the_list_filters_by_workflow_golden_set_status_and_mode(api_as, owner, workspace):
    client = api_as(owner)
    golden, version = make_set(workspace), new_version(workspace)
    other_set, other_version = make_set(workspace, name="other"), new_version(workspace, name="other")
    a = make_run(golden, version, status=EvolutionRun.Status.COMPLETED)
    b = make_run(other_set, other_version, mode=EvolutionRun.Mode.REFLECTIVE, status=EvolutionRun.Status.PAUSED)

    def ids(**params):
        return [row["id"] for row in client.get(RUNS, params).json()["results"]]

    assert ids() == [b.pk, a.pk]
    assert ids(workflow=version.workflow_id) == [a.pk] and ids(golden_set=other_set.pk) == [b.pk]
    assert ids(status="paused") == [b.pk] and ids(mode="gp") == [a.pk]
    assert client.get(RUNS, {"status": ["paused", "completed"]}).json()["results"][1]["id"] == a.pk


# -------------------------------------------------------------------------------------- genealogy, lineage

def test_the_genealogy_holds_the_individuals_and_their_ancestors_back_to_the_base(api_as, owner, workspace):
    golden = make_set(workspace)
    before = new_version(workspace, prompt="Before the base.")
    base = child_of(before, prompt="The base.")
    m1 = child_of(base, prompt="Mutant one.", generation=0)
    immigrant, _ = workflow_version_create(workflow=base.workflow, dsl=graph("a", node("a", prompt="Immigrant.")),
                                           operation="immigrant", generation=0)
    hidden = child_of(base, prompt="Bred but never scored.", generation=1)
    y = child_of(hidden, prompt="Child of the unscored one.", generation=1)
    cross = child_of(m1, immigrant, prompt="Crossed.", operation="crossover", generation=1)
    run = make_run(golden, base, best_version=cross)
    for number, version, fitness, kind in [(0, base, 40.0, "base"), (0, m1, 50.0, "prompt"),
                                           (0, immigrant, 30.0, "immigrant"), (1, m1, 55.0, "prompt"),
                                           (1, cross, 70.0, "crossover"), (1, y, 45.0, "tool")]:
        add_individual(run, number, version, fitness, kind=kind)
    body = api_as(owner).get(f"{RUNS}{run.pk}/genealogy/").json()
    nodes = {n["id"]: n for n in body["nodes"]}
    assert set(nodes) == {base.pk, m1.pk, immigrant.pk, cross.pk, y.pk, hidden.pk}  # not the base's ancestor
    assert nodes[m1.pk]["fitness"] == 55.0 and nodes[m1.pk]["generation"] == 0 and nodes[m1.pk]["kind"] == "prompt"
    assert nodes[hidden.pk] | {"url": ""} == {"id": hidden.pk, "generation": None, "operation": "mutation",
                                              "fitness": None, "kind": "", "is_base": False, "is_best": False,
                                              "url": ""}
    assert nodes[cross.pk]["is_best"] and nodes[base.pk]["is_base"] and nodes[base.pk]["operation"] == "mutation"
    assert nodes[y.pk]["url"].endswith(f"{VERSIONS}{y.pk}/")
    # the run's individuals first, oldest first, then the ancestors that did not take part
    assert [n["id"] for n in body["nodes"]] == [base.pk, m1.pk, immigrant.pk, y.pk, cross.pk, hidden.pk]
    assert {(e["source"], e["target"], e["operation"]) for e in body["edges"]} == {
        (base.pk, m1.pk, "mutation"), (m1.pk, cross.pk, "crossover"), (immigrant.pk, cross.pk, "crossover"),
        (base.pk, hidden.pk, "mutation"), (hidden.pk, y.pk, "mutation")}
    assert body["truncated"] is False and body["node_limit"] == views.GENEALOGY_MAX_NODES

    cut = views.run_genealogy(run, limit=3)
    assert cut["truncated"] and len(cut["nodes"]) == 3
    assert {e["target"] for e in cut["edges"]} <= {n["id"] for n in cut["nodes"]}

    queued = make_run(golden, m1)  # nothing scored yet: the base alone
    assert [n["id"] for n in api_as(owner).get(f"{RUNS}{queued.pk}/genealogy/").json()["nodes"]] == [m1.pk]


def test_a_versions_lineage_has_ancestors_descendants_and_its_path_with_fitness_changes(api_as, owner, workspace):
    golden, other_set = make_set(workspace), make_set(workspace, name="other")
    root = new_version(workspace, prompt="Root.")
    a = child_of(root, prompt="A.")
    side = child_of(root, prompt="Side.")
    b = child_of(a, side, prompt="B.", operation="crossover")
    c = child_of(b, prompt="C.")
    now = datetime.now(UTC)

    def scored(version, fitness, golden_set=golden, minutes=0, status=EvalRun.Status.COMPLETED):
        return EvalRun.objects.create(workspace=workspace, golden_set=golden_set, workflow_version=version,
                                      status=status, fitness=fitness, ended_at=now + timedelta(minutes=minutes))

    scored(root, 20.0)
    scored(a, 10.0, minutes=1)
    latest_a = scored(a, 30.0, golden_set=other_set, minutes=2)  # the latest completed run, on any set
    scored(a, 99.0, minutes=3, status=EvalRun.Status.RUNNING)
    scored(b, 45.0)
    body = api_as(owner).get(f"{VERSIONS}{b.pk}/lineage/").json()
    assert body["version"] == b.pk and body["url"].endswith(f"{VERSIONS}{b.pk}/") and not body["truncated"]
    assert [(x["id"], x["depth"]) for x in body["ancestors"]] == sorted([(a.pk, 1), (side.pk, 1), (root.pk, 2)],
                                                                       key=lambda pair: (pair[1], pair[0]))
    assert [(x["id"], x["depth"], x["operation"]) for x in body["descendants"]] == [(c.pk, 1, "mutation")]
    path = [(s["id"], s["operation"], s["fitness"], s["fitness_change"], s["eval_run"]) for s in body["path"]]
    assert path[0][:4] == (root.pk, "init", 20.0, None)
    assert path[1] == (a.pk, "mutation", 30.0, 10.0, latest_a.pk)
    assert path[2][:4] == (b.pk, "crossover", 45.0, 15.0)
    assert body["path"][1]["golden_set"] == other_set.pk and body["path"][2]["parent2"] == side.pk
    leaf = api_as(owner).get(f"{VERSIONS}{c.pk}/lineage/").json()
    assert leaf["path"][-1]["fitness"] is None and leaf["path"][-1]["fitness_change"] is None
    assert leaf["descendants"] == []


def test_the_lineage_route_lives_in_the_workflows_url_space_without_colliding():
    from workflows.api.urls import router

    assert resolve("/api/workflow-versions/5/lineage/").func.cls is views.VersionLineageViewSet
    assert "workflow-version-lineage" not in {pattern.name for pattern in router.urls}
    assert resolve("/api/workflow-versions/5/activate/").url_name == "workflow-version-activate"
    assert resolve("/api/workflow-versions/5/").url_name == "workflow-version-detail"


def test_the_schema_documents_the_evolution_endpoints_and_the_config(api_as, owner):
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.generators import SchemaGenerator

    GENERATOR_STATS.reset()
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert [m for m in [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
            if "evolution" in m.lower() or "lineage" in m.lower() or "genealog" in m.lower()] == []
    paths = api_as(owner).get("/api/schema/?format=json").json()["paths"]
    assert {"/api/evolution-runs/", "/api/evolution-runs/{id}/", "/api/evolution-runs/{id}/pause/",
            "/api/evolution-runs/{id}/resume/", "/api/evolution-runs/{id}/cancel/",
            "/api/evolution-runs/{id}/promote-best/", "/api/evolution-runs/{id}/generations/",
            "/api/evolution-runs/{id}/individuals/", "/api/evolution-runs/{id}/genealogy/",
            "/api/workflow-versions/{id}/lineage/"} <= set(paths)
    assert set(paths) == set(schema["paths"])
    config = schema["components"]["schemas"]["EvolutionRunStartRequest"]["properties"]["config"]
    for key, (kind, low, high) in LIMITS.items():
        assert config["properties"][key].items() >= {"minimum": low, "maximum": high, "default": DEFAULTS[key],
                                                      "type": "integer" if kind is int else "number"}.items(), key
    create = paths["/api/evolution-runs/"]["post"]
    assert "| `population` | `8` | whole number from 2 to 100 |" in create["description"]
    assert "202" in create["responses"]
    assert str(views.GENEALOGY_MAX_NODES) in paths["/api/evolution-runs/{id}/genealogy/"]["get"]["description"]
    assert "latest completed eval run on any golden set" in \
        paths["/api/workflow-versions/{id}/lineage/"]["get"]["description"]
    assert {p["name"] for p in paths["/api/evolution-runs/"]["get"]["parameters"]} >= {
        "workflow", "golden_set", "status", "mode", "workspace", "cursor"}
    assert {p["name"] for p in paths["/api/evolution-runs/{id}/individuals/"]["get"]["parameters"]} >= {
        "generation", "survived", "kind", "cursor"}
    assert "409" in paths["/api/evolution-runs/{id}/promote-best/"]["post"]["responses"]


# ---------------------------------------------------------------------------------------- query budgets

def _runs(workspace, n):
    golden = make_set(workspace, name=f"set {EvolutionRun.objects.count()}")
    version = WorkflowVersion.objects.filter(workflow__workspace=workspace).first() or new_version(workspace)
    for _ in range(n):
        make_run(golden, version, best_version=version, durable_run_id=f"evo-x{EvolutionRun.objects.count()}")


def test_the_run_list_costs_the_same_for_1_and_50_runs(api_as, owner, workspace, django_assert_max_num_queries):
    client = api_as(owner)
    _runs(workspace, 1)
    one, _ = _count(client, RUNS)
    _runs(workspace, 49)
    many, response = _count(client, RUNS)
    assert len(response.json()["results"]) == 50
    assert many == one
    with django_assert_max_num_queries(1):  # scoping and the page, in one statement
        client.get(RUNS)


def _chain(base, length: int, generation: int = 0) -> list[WorkflowVersion]:
    """`length` versions bred from `base`: a line of mutants, every third one crossed with the base."""
    versions, parent = [], base
    for index in range(length):
        parents = (parent, base) if index % 3 == 2 else (parent,)
        parent = child_of(*parents, prompt=f"Step {index} of {base.pk}.", generation=generation,
                          operation="crossover" if len(parents) == 2 else "mutation")
        versions.append(parent)
    return versions


def test_details_generations_individuals_genealogy_and_lineage_cost_the_same_for_few_and_many(
        api_as, owner, workspace, django_assert_max_num_queries):
    client = api_as(owner)
    golden = make_set(workspace)
    small_base, wide_base = new_version(workspace, name="small"), new_version(workspace, name="wide")
    small, wide = make_run(golden, small_base), make_run(golden, wide_base)
    add_individual(small, 0, small_base, 10.0, kind="base")
    add_individual(wide, 0, wide_base, 10.0, kind="base")
    eval_run = EvalRun.objects.create(workspace=workspace, golden_set=golden, workflow_version=wide_base,
                                      status=EvalRun.Status.COMPLETED, fitness=10.0)
    versions = _chain(wide_base, 40)
    for index, version in enumerate(versions):
        add_individual(wide, 1 + index // 2, version, 10.0 + index, eval_run=eval_run)
        EvalRun.objects.create(workspace=workspace, golden_set=golden, workflow_version=version,
                               status=EvalRun.Status.COMPLETED, fitness=10.0 + index)
    EvolutionRun.objects.filter(pk=wide.pk).update(best_version=versions[-1])
    few_leaf = child_of(small_base, prompt="Small leaf.")
    pairs = [(f"{RUNS}{small.pk}/", f"{RUNS}{wide.pk}/", 1),
             (f"{RUNS}{small.pk}/generations/", f"{RUNS}{wide.pk}/generations/", 2),  # the run, then the page
             (f"{RUNS}{small.pk}/individuals/", f"{RUNS}{wide.pk}/individuals/", 2),
             # the run, its individuals' aggregates, the versions (one recursive query)
             (f"{RUNS}{small.pk}/genealogy/", f"{RUNS}{wide.pk}/genealogy/", 3),
             # the version, ancestors, descendants, their rows, their latest eval runs
             (f"{VERSIONS}{few_leaf.pk}/lineage/", f"{VERSIONS}{versions[20].pk}/lineage/", 5)]
    for few_url, many_url, budget in pairs:
        few, _ = _count(client, few_url)
        many, _ = _count(client, many_url)
        assert few == many, (few_url, few, many)
        with django_assert_max_num_queries(budget):
            client.get(many_url)
    assert len(client.get(f"{RUNS}{wide.pk}/genealogy/").json()["nodes"]) == 41
    assert len(client.get(f"{RUNS}{wide.pk}/individuals/").json()["results"]) == 41
    assert len(client.get(f"{RUNS}{wide.pk}/generations/").json()["results"]) == 21
    lineage = client.get(f"{VERSIONS}{versions[20].pk}/lineage/").json()
    assert len(lineage["ancestors"]) == 21 and len(lineage["descendants"]) == 19 and len(lineage["path"]) == 22
