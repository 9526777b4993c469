"""The evolution admin: what an operator sees of evolution runs (the list, the Start evolution page, the
run page with its fitness chart, generations, individuals and genealogy graph, Pause / Resume / Cancel /
Promote best) and of generations and individuals, and the guarantees around them: workspace scope, POST
views with CSRF and the change permission, escaped user text (also inside the SVGs), query budgets that do
not grow with rows, and a genealogy of ~300 versions that stays quick and compact."""

import hashlib
import random
import re

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from durable.inprocess import run_until_settled
from durable.models import DurableRun
from evals.models import Promotion
from evals.services import golden_set_create
from evolution import charts
from evolution.admin import ancestor_columns
from evolution.conf import DEFAULTS
from evolution.models import EvolutionRun, Generation, Individual
from evolution.services import evolution_start
from tests.admin_users import admin_staff, client_of
from tests.builders import graph, node
from workflows.models import WorkflowVersion
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create

pytestmark = pytest.mark.django_db

SMALL = {"population": 3, "generations": 2, "seed": 1}
XSS = '<script>alert("x")</script>'
XSS_IMG = '<img src=x onerror=alert("i")>'


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Runs are driven in-process here (run_until_settled)."""
    settings.DURABLE_DISPATCH_ENABLED = False


def staff_user(username: str, *workspaces, codenames=None):
    """A staff member of `workspaces` with the evolution, evals, workflows and durable apps' permissions
    (`codenames` to narrow them)."""
    return admin_staff(username, *workspaces, apps=("evolution", "evals", "workflows", "durable"), codenames=codenames)



@pytest.fixture
def staff(workspace):
    return staff_user("acme-staff", workspace)


@pytest.fixture
def staff_client(staff):
    return client_of(staff)


@pytest.fixture
def outsider_client(other_workspace):
    return client_of(staff_user("globex-staff", other_workspace))


@pytest.fixture
def viewer_client(workspace):
    """A member who may only look."""
    return client_of(staff_user("viewer", workspace, codenames=[
        "view_evolutionrun", "view_generation", "view_individual", "view_workflowversion"]))


@pytest.fixture
def small_run(facts, support_set, support_base, evolve):
    """A real GP run of the offline model: 3 individuals a generation, 2 generations."""
    run = evolve(support_base.workflow, support_set, config=SMALL)
    assert run.status == "completed", run.error
    assert run.best_fitness > run.base_fitness
    return run


@pytest.fixture
def held_out_run(facts, held_out_set, support_base, evolve):
    """A real GP run on a set that carries a held-out claim (12 train, 6 validation, 6 test items)."""
    run = evolve(support_base.workflow, held_out_set, config=SMALL)
    assert run.status == "completed", run.error
    assert run.report["held_out"] and run.test_lift > 0.1
    return run


def run_url(run, view: str = "change") -> str:
    return reverse(f"admin:evolution_evolutionrun_{view}", args=[run.pk])


def version_url(pk) -> str:
    return reverse("admin:workflows_workflowversion_change", args=[pk])


def messages_of(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def last_message(response) -> str:
    """The message a POST added (messages of earlier POSTs stay queued until a page shows them)."""
    return messages_of(response)[-1]


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(captured)


def synthetic_run(workspace, *, generations: int, per_generation: int, name: str = "synthetic", seed: int = 0,
                  note: str = "", kind: str = "") -> EvolutionRun:
    """A finished GP run written straight to the tables (no evaluation): `per_generation` new versions a
    generation (mutations of one earlier version, crossovers of two, immigrants), each an individual with
    a random fitness; generation 0 starts with the base."""
    rng = random.Random(seed)
    workflow = workflow_create(workspace=workspace, name=name)
    base, _ = workflow_version_create(workflow=workflow, dsl=graph("agent", node("agent", prompt="base")))
    golden_set = golden_set_create(workspace=workspace, name=f"{name} set", graders=[{"kind": "exact"}])
    run = EvolutionRun.objects.create(
        workspace=workspace, workflow=workflow, golden_set=golden_set, base_version=base, status="completed",
        config={**DEFAULTS, "population": per_generation, "generations": generations, "seed": seed},
        base_fitness=10.0, generations_done=generations, stop_reason=f"{generations} generations done",
        started_at=timezone.now(), ended_at=timezone.now())
    pool, made, total = [base], 0, 0
    for number in range(generations):
        fresh = []
        for _ in range(per_generation - (number == 0)):
            made += 1
            operation = rng.choice(["mutation", "mutation", "crossover", "immigrant"])
            fresh.append(WorkflowVersion(
                workflow=workflow, dsl={"synthetic": made},
                dsl_hash=hashlib.sha256(f"{name}:{made}".encode()).hexdigest(),
                operation=operation, generation=number, commit_message=f"synthetic {made}",
                parent1=rng.choice(pool) if operation != "immigrant" else None,
                parent2=rng.choice(pool) if operation == "crossover" else None))
        WorkflowVersion.objects.bulk_create(fresh)
        members = ([base] if number == 0 else []) + fresh
        fitness = {v.pk: (10.0 if v.pk == base.pk else round(rng.uniform(5, 95), 3)) for v in members}
        total += len(fresh) + (number == 0)
        values = list(fitness.values())
        mean = sum(values) / len(values)
        generation = Generation.objects.create(
            evolution_run=run, number=number, best_workflow_version_id=max(fitness, key=fitness.get),
            started_at=timezone.now(), ended_at=timezone.now(),
            stats={"best": max(values), "avg": mean, "worst": min(values), "members": len(values),
                   "stddev": (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5, "run_evaluations": total,
                   "improvement": None if number == 0 else 1.5})
        Individual.objects.bulk_create([Individual(
            evolution_run=run, generation=generation, workflow_version=v, fitness=fitness[v.pk],
            avg_score=fitness[v.pk] / 100, kind=kind or ("base" if v.pk == base.pk else v.operation),
            note=note or f"made by {v.operation}", survived=fitness[v.pk] > 50) for v in members])
        pool += fresh
    best = Individual.objects.filter(evolution_run=run).order_by("-fitness").first()
    EvolutionRun.objects.filter(pk=run.pk).update(best_version=best.workflow_version, best_fitness=best.fitness,
                                                  evaluations=total, rollouts=total * 6)
    run.refresh_from_db()
    return run


# ----------------------------------------------------------------------------------------- the lists

def test_every_evolution_page_opens_for_a_real_run(staff_client, small_run):
    generation = Generation.objects.filter(evolution_run=small_run).first()
    individual = Individual.objects.filter(evolution_run=small_run).first()
    for url in (reverse("admin:evolution_evolutionrun_changelist"), run_url(small_run),
                reverse("admin:evolution_evolutionrun_start"),
                reverse("admin:evolution_generation_changelist"),
                reverse("admin:evolution_generation_change", args=[generation.pk]),
                reverse("admin:evolution_individual_changelist"),
                reverse("admin:evolution_individual_change", args=[individual.pk])):
        assert staff_client.get(url).status_code == 200, url


def test_run_list_shows_workflow_mode_status_facets_progress_fitness_lift_and_counters(
        staff_client, small_run, support_set, support_base):
    queued = evolution_start(workflow=support_base.workflow, golden_set=support_set, config={**SMALL, "seed": 9})
    url = reverse("admin:evolution_evolutionrun_changelist")
    response = staff_client.get(url)
    html = response.content.decode()
    assert [row.pk for row in response.context["cl"].result_list] == [queued.pk, small_run.pk]
    assert "support" in html and "Genetic programming" in html
    assert 'class="wf-status wf-status-completed"' in html and 'class="wf-status wf-status-queued"' in html
    assert re.search(r"Completed\s*\(1\)", html) and re.search(r"Queued\s*\(1\)", html)  # facets, always on
    assert "2 / 2" in html and "0 / 2" in html
    assert f"{small_run.best_fitness:.2f}" in html
    assert f'<span class="evo-up">{small_run.lift * 100:+.1f}%</span>' in html and small_run.lift > 0.1
    row = re.search(rf'<tr>.*?evolutionrun/{small_run.pk}/change/.*?</tr>', html, re.S).group(0)
    # evaluations (rollouts), in one column so the list fits a 1440 px screen
    assert f'<td class="field-work_display">{small_run.evaluations} ({small_run.rollouts})</td>' in row
    assert "$0.00" in row
    assert 'id="evo-start-link"' in html

    def listed(query):
        return {row.pk for row in staff_client.get(url + query).context["cl"].result_list}

    assert listed("?status__exact=queued") == {queued.pk}
    assert listed(f"?workflow={support_base.workflow_id}") == {queued.pk, small_run.pk}
    assert listed(f"?q={small_run.pk}") == {small_run.pk}
    assert listed(f"?q={small_run.durable_run_id}") == {small_run.pk}
    assert listed("?o=-7") and listed("?workflow=x") == set()  # sorted by lift; a bad filter value matches nothing


# ---------------------------------------------------------------------------------------- the run page

def test_run_page_shows_config_counters_stop_reason_and_links(staff_client, small_run):
    response = staff_client.get(run_url(small_run))
    assert response.status_code == 200
    html = response.content.decode()
    assert f"Evolution run {small_run.pk} of support on support" in html
    assert "2 generations done" in html and "Genetic programming" in html
    assert "&quot;population&quot;: 3" in html and "&quot;seed&quot;: 1" in html  # the configuration
    base, best = small_run.base_version, small_run.best_version
    assert f'<a href="{version_url(base.pk)}" id="evo-base-version">{base.dsl_hash[:12]}</a>' in html
    assert f'<a href="{version_url(best.pk)}" id="evo-best-version">{best.dsl_hash[:12]}</a>' in html
    assert f"fitness {small_run.base_fitness:.2f}" in html and f"fitness {small_run.best_fitness:.2f}" in html
    assert reverse("admin:durable_durablerun_change", args=[small_run.durable_run_id]) in html
    assert f"{small_run.lift * 100:+.1f}%" in html
    assert f"{small_run.generations_done} / 2" in html
    for counter in ("evaluations", "rollouts", "cache_hits"):
        assert re.search(rf'field-{counter}.*?<div class="readonly">{getattr(small_run, counter)}</div>', html, re.S)
    # a completed run: nothing to pause, resume or cancel; its best can be promoted
    assert 'id="evo-promote"' in html
    assert not any(f'id="evo-{name}"' in html for name in ("pause", "resume", "cancel"))


def test_run_page_shows_the_held_out_result(staff_client, held_out_run):
    run = held_out_run
    report, test = run.report, run.report["test"]
    html = staff_client.get(run_url(run)).content.decode()
    module = re.search(r'<div class="module wf-section" id="evo-report">.*?\n</div>', html, re.S).group(0)
    assert "Generalization <small>(held-out test split)</small>" in module
    assert "Searched on 12 train items, the best selected on 6 validation items, then base and best scored once " \
           "on 6 test items that nothing in the search read." in module
    for role in ("base", "best"):
        cells = "".join(f"<td>{report[role][split]:.2f}</td>" for split in ("train", "validation", "test"))
        assert f'<tr class="evo-report-{role}"><th>{role}</th>{cells}</tr>' in module
    c = test["comparison"]
    assert (f'<dd id="evo-test-lift"><span class="evo-up">{test["lift"] * 100:+.1f}%</span> <span class="wf-muted">'
            f'95% interval {test["lift_low"] * 100:+.1f}% to {test["lift_high"] * 100:+.1f}%</span></dd>') in module
    assert (f'better: Wilcoxon p = 0.0312 (alpha 0.05) on 6 paired items; mean score difference '
            f'{c["mean_diff"]:+.2f} (95% interval {c["ci_low"]:+.2f} to {c["ci_high"]:+.2f})') in module
    assert f'<dd id="evo-gap">{report["train_test_gap"]:+.2f} ' in module
    assert '<span id="evo-held-out">yes</span>' in html and "active version on the run's test items" in html
    # the list's lift is the test split's
    listed = staff_client.get(reverse("admin:evolution_evolutionrun_changelist")).content.decode()
    assert (f'<span class="evo-up">{test["lift"] * 100:+.1f}%</span> <span class="wf-muted evo-lift-on">on test'
            '</span>') in listed


def test_run_page_of_a_set_too_small_to_split_says_it_makes_no_held_out_claim(staff_client, small_run):
    html = staff_client.get(run_url(small_run)).content.decode()
    module = re.search(r'<div class="module wf-section" id="evo-report">.*?\n</div>', html, re.S).group(0)
    assert "Generalization <small>(no held-out claim)</small>" in module
    assert "Searched and selected on the whole set, so its lift is measured on the items it optimized: The set " \
           "has 6 items: a held-out split needs at least 12 (EVAL_MIN_SPLIT_ITEMS)." in module
    assert f'<tr class="evo-report-best"><th>best</th><td>{small_run.best_fitness:.2f}</td></tr>' in module
    assert "evo-test-lift" not in module and '<span id="evo-held-out">no</span>' in html
    assert "on a fresh eval run of support (reuse off: the run has no held-out claim)" in html


def test_run_page_draws_the_fitness_of_each_generation(staff_client, small_run):
    response = staff_client.get(run_url(small_run))
    svg = str(response.context["fitness_svg"])
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="evo-fitness"')
    assert svg in response.content.decode()
    generations = list(Generation.objects.filter(evolution_run=small_run).order_by("number"))
    for key in ("best", "avg", "worst"):
        points = re.findall(rf'class="evo-point evo-point-{key}" data-series="{key}" data-generation="(\d+)" '
                            r'data-value="([\d.]+)"', svg)
        assert [(int(n), round(float(v), 4)) for n, v in points] == [
            (g.number, round(g.stats[key], 4)) for g in generations], key
    assert ">generation</text>" in svg and ">fitness</text>" in svg  # axis titles
    assert ">best</text>" in svg and ">average</text>" in svg and ">worst</text>" in svg  # legend
    assert f"base ({small_run.base_fitness:.2f})" in svg and 'class="evo-base-line"' in svg
    # a higher fitness is drawn higher
    best = [float(y) for y in re.findall(r'evo-point-best".*?cy="([\d.]+)"', svg)]
    assert generations[1].stats["best"] > generations[0].stats["best"] and best[1] < best[0]


def test_run_page_lists_generations_with_their_individuals(staff_client, small_run):
    response = staff_client.get(run_url(small_run))
    html = response.content.decode()
    rows = response.context["generation_rows"]
    generations = list(Generation.objects.filter(evolution_run=small_run).order_by("number"))
    assert [row["number"] for row in rows] == [0, 1]
    evaluations = [generations[0].stats["run_evaluations"],
                   generations[1].stats["run_evaluations"] - generations[0].stats["run_evaluations"]]
    for row, generation, evaluated in zip(rows, generations, evaluations, strict=True):
        stats = generation.stats
        assert (row["best"], row["avg"], row["worst"], row["stddev"]) == tuple(
            f"{stats[key]:.2f}" for key in ("best", "avg", "worst", "stddev"))
        assert row["evaluations"] == evaluated
        individuals = list(generation.individuals.select_related("workflow_version"))
        assert {i["pk"] for i in row["individuals"]} == {i.pk for i in individuals}
        for individual in individuals:
            shown = next(i for i in row["individuals"] if i["pk"] == individual.pk)
            assert shown["version_url"] == version_url(individual.workflow_version_id)
            assert (shown["kind"], shown["note"], shown["fitness"], shown["survived"]) == (
                individual.kind, individual.note, f"{individual.fitness:.2f}", individual.survived)
            assert reverse("admin:evals_evalrun_change", args=[individual.eval_run_id]) in html
    assert rows[0]["improvement"] == "-" and rows[1]["improvement"] == f"{generations[1].stats['improvement']:+.2f}"
    assert html.count('<tr class="evo-individual"') == Individual.objects.filter(evolution_run=small_run).count()
    assert "the base version" in html and 'evo-badge-best">best<' in html


def test_run_page_draws_the_genealogy_of_every_version_that_took_part(staff_client, small_run):
    response = staff_client.get(run_url(small_run))
    svg = str(response.context["genealogy_svg"])
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" class="evo-genealogy"')
    members = set(Individual.objects.filter(evolution_run=small_run).values_list("workflow_version_id", flat=True))
    nodes = re.findall(r'<a class="(evo-node[^"]*)" href="([^"]+)" data-version="(\d+)" data-column="(-?\d+)"', svg)
    assert {int(pk) for *_, pk, _ in nodes} == members
    for _classes, href, pk, column in nodes:
        assert href == version_url(pk)  # each node opens its version's page
        first = Individual.objects.filter(evolution_run=small_run, workflow_version_id=pk) \
            .order_by("generation__number").values_list("generation__number", flat=True).first()
        assert int(column) == first  # placed in the generation it first took part in
    classes = {int(pk): cls for cls, _, pk, _ in nodes}
    assert "evo-node-base" in classes[small_run.base_version_id]
    assert {"evo-node-best", "evo-node-lineage"} <= set(classes[small_run.best_version_id].split())
    # an edge from each parent to its child, styled by the operation; the best's descent drawn dark
    versions = WorkflowVersion.objects.filter(pk__in=members)
    expected = {(parent, v.pk, v.operation) for v in versions if v.operation != "immigrant"
                for parent in (v.parent1_id, v.parent2_id) if parent in members}
    edges = set(re.findall(r'<path class="evo-edge evo-edge-(\w+)[^"]*" data-from="(\d+)" data-to="(\d+)"', svg))
    assert {(int(a), int(b), kind) for kind, a, b in edges} == expected and expected
    assert re.search(rf'evo-edge-lineage" data-from="{small_run.base_version_id}" data-to="\d+"', svg) or \
        WorkflowVersion.objects.get(pk=small_run.best_version_id).parent1_id != small_run.base_version_id
    # the tooltip says how each version was made and what it scored
    best = Individual.objects.filter(evolution_run=small_run, workflow_version=small_run.best_version).first()
    assert f"kind: {best.kind}" in svg and f"fitness: {best.fitness:.2f}" in svg
    assert 'id="evo-fitness-scale"' in svg and 'class="evo-scale-low"' in svg  # the legend's scale


def test_the_genealogy_reaches_back_to_the_base_through_versions_outside_the_run(staff_client, workspace):
    run = synthetic_run(workspace, generations=2, per_generation=3, name="reach")
    base = run.base_version
    bridge, _ = workflow_version_create(workflow=run.workflow, dsl=graph("agent", node("agent", prompt="bridge")),
                                        operation="mutation", parents=(base,))
    older, _ = workflow_version_create(workflow=run.workflow, dsl=graph("agent", node("agent", prompt="older")),
                                       operation="mutation", parents=(bridge,))
    child, _ = workflow_version_create(workflow=run.workflow, dsl=graph("agent", node("agent", prompt="child")),
                                       operation="mutation", parents=(older,))
    Individual.objects.create(evolution_run=run, generation=run.generations.get(number=1), workflow_version=child,
                              fitness=50, kind="prompt")
    ancestor_of_base, _ = workflow_version_create(workflow=run.workflow, dsl=graph("a", node("a", prompt="x")))
    unrelated, _ = workflow_version_create(workflow=run.workflow, dsl=graph("a", node("a", prompt="y")))
    svg = str(staff_client.get(run_url(run)).context["genealogy_svg"])
    columns = dict((int(pk), int(col)) for pk, col in re.findall(r'data-version="(\d+)" data-column="(-?\d+)"', svg))
    assert columns[child.pk] == 1 and columns[older.pk] == 0 and columns[bridge.pk] == -1
    assert ancestor_of_base.pk not in columns and unrelated.pk not in columns
    assert re.search(rf'class="evo-node evo-node-mutation evo-node-unscored" href="[^"]+" data-version="{older.pk}"',
                     svg)
    assert ">earlier</text>" in svg


def test_ancestor_columns_sit_left_of_their_leftmost_child():
    nodes = {1: {"column": 0, "parents": []}, 2: {"column": None, "parents": [1]},
             3: {"column": None, "parents": [2]}, 4: {"column": 3, "parents": [3]}, 5: {"column": 1, "parents": [3]},
             6: {"column": None, "parents": []}}
    ancestor_columns(nodes)
    assert (nodes[3]["column"], nodes[2]["column"], nodes[6]["column"]) == (0, -1, -1)


# --------------------------------------------------------------------------------------- start page

def test_start_page_starts_a_run_that_completes(staff_client, staff, facts, support_set, support_base):
    url = reverse("admin:evolution_evolutionrun_start")
    page = staff_client.get(url + f"?workflow={support_base.workflow_id}")
    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["workflow"] == str(support_base.workflow_id)
    assert dict(form.fields["workflow"].choices)[support_base.workflow_id] == "Acme · support"
    assert dict(form.fields["golden_set"].choices)[support_set.pk] == "Acme · support"
    response = staff_client.post(url, {"workflow": support_base.workflow_id, "golden_set": support_set.pk,
                                       "mode": "gp", "population": 3, "generations": 2, "seed": 1,
                                       "goal": "answer from the knowledge base"})
    run = EvolutionRun.objects.get()
    assert response.status_code == 302 and response.url == run_url(run)
    assert any(f"Started evolution run {run.pk} of support on support (Genetic programming, population 3, 2 "
               "generations, seed 1)" in text for text in messages_of(response))
    assert (run.created_by, run.status, run.goal_text) == (staff, "queued", "answer from the knowledge base")
    assert (run.config["population"], run.config["generations"], run.config["seed"]) == (3, 2, 1)
    run_until_settled(run.durable_run_id, max_wait=300)
    run.refresh_from_db()
    assert run.status == "completed"


def test_start_page_shows_the_services_refusals_on_their_fields(client, workspace, other_workspace, support_set,
                                                                support_base):
    client.force_login(staff_user("both", workspace, other_workspace))
    url = reverse("admin:evolution_evolutionrun_start")
    data = {"workflow": support_base.workflow_id, "golden_set": support_set.pk, "mode": "gp", "population": 1,
            "generations": 500, "seed": 0}
    response = client.post(url, data)
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert errors["population"] == ["must be from 2 to 100"] and errors["generations"] == ["must be from 1 to 200"]
    html = response.content.decode()
    assert "Not started: correct the problems below." in html and "must be from 2 to 100" in html
    foreign = golden_set_create(workspace=other_workspace, name="globex set", graders=[{"kind": "exact"}])
    response = client.post(url, {**data, "population": 3, "generations": 2, "golden_set": foreign.pk})
    assert response.context["form"].errors["golden_set"] == ["belongs to another workspace"]
    empty = workflow_create(workspace=workspace, name="empty")
    response = client.post(url, {**data, "population": 3, "generations": 2, "workflow": empty.pk})
    assert response.context["form"].errors["workflow"] == ["has no version to evolve"]
    response = client.post(url, {**data, "mode": "magic"})
    assert "mode" in response.context["form"].errors
    assert not EvolutionRun.objects.exists()


# ------------------------------------------------------------------------------- pause, resume, cancel

def test_pause_then_resume_a_run_from_its_page(staff_client, facts, support_set, support_base):
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    page = staff_client.get(run_url(run)).content.decode()
    assert 'id="evo-pause"' in page and 'id="evo-cancel"' in page and 'id="evo-resume"' not in page
    assert 'id="evo-promote"' not in page  # no best version yet
    response = staff_client.post(run_url(run, "pause"))
    assert response.status_code == 302 and response.url == run_url(run)
    assert last_message(response) == (f"Evolution run {run.pk} pauses at the next generation boundary (the "
                                      "generation under way finishes first).")
    run.refresh_from_db()
    assert run.status == "paused"
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert (run.status, run.paused_at, run.generations_done) == ("paused", "g1", 1)
    page = staff_client.get(run_url(run)).content.decode()
    assert 'id="evo-resume"' in page and 'id="evo-pause"' not in page and "waiting at boundary g1" in page
    assert 'id="evo-promote"' in page  # generation 0 named a best version
    response = staff_client.post(run_url(run, "resume"))
    assert last_message(response) == f"Resumed evolution run {run.pk}."
    run_until_settled(run.durable_run_id, max_wait=120)
    run.refresh_from_db()
    assert (run.status, run.generations_done) == ("completed", 2)
    refused = staff_client.post(run_url(run, "pause"))
    assert last_message(refused) == "Not paused: status: a completed run cannot be paused."
    assert last_message(staff_client.post(run_url(run, "resume"))) == \
        "Not resumed: status: a completed run is not paused."
    assert EvolutionRun.objects.get(pk=run.pk).status == "completed"


def test_cancel_ends_a_run_and_its_durable_run(staff_client, facts, support_set, support_base):
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    response = staff_client.post(run_url(run, "cancel"))
    assert response.status_code == 302 and response.url == run_url(run)
    assert last_message(response) == f"Cancelled evolution run {run.pk} and its eval runs under way."
    run.refresh_from_db()
    assert run.status == "cancelled" and DurableRun.objects.get(pk=run.durable_run_id).status == "cancelled"
    assert last_message(staff_client.post(run_url(run, "cancel"))) == \
        f"Evolution run {run.pk} was not cancelled: it is cancelled."
    page = staff_client.get(run_url(run)).content.decode()
    assert not any(f'id="evo-{name}"' in page for name in ("pause", "resume", "cancel"))


# ------------------------------------------------------------------------------------------ promote best

def test_promote_best_activates_it_over_the_active_base_with_the_evidence(staff_client, staff, small_run, evaluate):
    base, best = small_run.base_version, small_run.best_version
    workflow_version_activate(version=base)
    # no held-out claim (6 items): the search's own measurements of the whole set do not back a promotion
    assert last_message(staff_client.post(run_url(small_run, "promote"))) == (
        "Not promoted: report: the run has no held-out claim: its best was selected on the items a promotion would "
        "judge it on. Run an eval of the best version on the whole set without reusing results, then promote.")
    assert not Promotion.objects.exists()
    assert evaluate(small_run.golden_set, best, reuse=False).status == "completed"  # a fresh eval run backs it
    response = staff_client.post(run_url(small_run, "promote"))
    assert response.status_code == 302 and response.url == run_url(small_run)
    text = last_message(response)
    promotion = Promotion.objects.get()
    assert text.startswith(f"Promoted {best.dsl_hash[:12]} (the run's best, fitness {small_run.best_fitness:.2f})"
                           f" to the active version of support (it replaces version {base.dsl_hash[:12]}). "
                           "Evidence: verdict better, p = 0.0312 (alpha 0.05), mean difference +")
    assert reverse("admin:evals_promotion_change", args=[promotion.pk]) in text
    best.refresh_from_db()
    assert best.status == "active" and (promotion.workflow_version, promotion.decided_by) == (best, staff)
    page = staff_client.get(run_url(small_run)).content.decode()
    assert 'id="evo-promote"' not in page and "The best version is the workflow's active version." in page
    again = staff_client.post(run_url(small_run, "promote"))
    assert last_message(again) == "Not promoted: workflow_version: is already the active version."


def test_a_refused_promotion_shows_the_verdict_and_p_value_and_changes_nothing(staff_client, small_run, evaluate):
    best = small_run.best_version
    peer = Individual.objects.filter(evolution_run=small_run, fitness=small_run.best_fitness) \
        .exclude(workflow_version=best).select_related("workflow_version").first()
    assert peer is not None  # an equally fit version: the best is not significantly better than it
    workflow_version_activate(version=peer.workflow_version)
    assert evaluate(small_run.golden_set, best, reuse=False).status == "completed"
    response = staff_client.post(run_url(small_run, "promote"))
    [text] = messages_of(response)
    assert text.startswith("Not promoted: the candidate is not significantly better than the active version (no "
                           "significant difference, p=1.0, alpha=0.05). Evidence: verdict no significant difference, "
                           "p = 1.0000 (alpha 0.05), mean difference +0.000 on 6 paired items")
    best.refresh_from_db()
    assert best.status == "candidate" and not Promotion.objects.exists()


def test_promote_best_of_a_held_out_run_is_judged_on_its_test_items(staff_client, held_out_run):
    from evals.selectors import split_items

    run = held_out_run
    workflow_version_activate(version=run.base_version)
    response = staff_client.post(run_url(run, "promote"))
    [text] = messages_of(response)
    assert "Evidence: verdict better, p = 0.0312 (alpha 0.05), mean difference +" in text
    assert "on 6 paired items of the test split against the active version." in text
    promotion = Promotion.objects.get()
    evidence = promotion.evidence
    assert promotion.workflow_version == run.best_version
    assert evidence["item_ids"] == sorted(split_items(run.golden_set)["test"]) and evidence["comparison"]["n"] == 6
    assert (evidence["eval_run_a"], evidence["eval_run_b"]) == (run.report["test"]["eval_runs"]["base"],
                                                                run.report["test"]["eval_runs"]["best"])
    assert {row["item"] for row in evidence["items"]} == set(evidence["item_ids"])


def test_promote_needs_a_best_version(staff_client, support_set, support_base):
    run = evolution_start(workflow=support_base.workflow, golden_set=support_set, config=SMALL)
    assert last_message(staff_client.post(run_url(run, "promote"))) == \
        "Not promoted: best_version: the run has no best version yet."


# ------------------------------------------------------------------------------ permissions and scope

def post_urls(run) -> dict[str, str]:
    return {name: run_url(run, name) for name in ("pause", "resume", "cancel", "promote")}


def test_post_views_need_post_csrf_and_the_change_permission(staff, viewer_client, small_run, support_set,
                                                              support_base):
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(staff)
    start = reverse("admin:evolution_evolutionrun_start")
    data = {"workflow": support_base.workflow_id, "golden_set": support_set.pk, "mode": "gp", "population": 3,
            "generations": 2, "seed": 1}
    for name, url in {**post_urls(small_run), "start": start}.items():
        if name != "start":  # the start page is a form: GET shows it
            assert checked.get(url).status_code == 405, name
        assert checked.post(url, data).status_code == 403, name  # no CSRF token
        assert viewer_client.post(url, data).status_code == 403, name
        assert Client().post(url, data).status_code == 302, name  # to the login page
    assert viewer_client.get(start).status_code == 403
    assert EvolutionRun.objects.count() == 1 and not Promotion.objects.exists()
    assert WorkflowVersion.objects.get(pk=small_run.best_version_id).status == "candidate"
    # a viewer sees the pages without their buttons
    page = viewer_client.get(run_url(small_run)).content.decode()
    assert 'id="evo-promote"' not in page and "need the permission to change evolution runs" in page
    listing = viewer_client.get(reverse("admin:evolution_evolutionrun_changelist")).content.decode()
    assert 'id="evo-start-link"' not in listing


def test_another_workspaces_runs_are_absent_and_cannot_be_acted_on(outsider_client, small_run, support_set,
                                                                   support_base):
    generation = Generation.objects.filter(evolution_run=small_run).first()
    individual = Individual.objects.filter(evolution_run=small_run).first()
    for url in (run_url(small_run), reverse("admin:evolution_generation_change", args=[generation.pk]),
                reverse("admin:evolution_individual_change", args=[individual.pk])):
        response = outsider_client.get(url)
        assert response.status_code == 302 and response.url == reverse("admin:index"), url
    for model in ("evolutionrun", "generation", "individual"):
        listing = outsider_client.get(reverse(f"admin:evolution_{model}_changelist"))
        assert listing.status_code == 200 and not list(listing.context["cl"].result_list), model
    filters = outsider_client.get(reverse("admin:evolution_evolutionrun_changelist")).content.decode()
    assert "support" not in filters and "Acme" not in filters  # not even as filter choices
    for name, url in post_urls(small_run).items():
        response = outsider_client.post(url)
        assert response.status_code == 302 and response.url == reverse("admin:index"), name
    # the start page offers only the outsider's workspaces, and refuses another's workflow
    start = reverse("admin:evolution_evolutionrun_start")
    page = outsider_client.get(start)
    assert "support" not in page.content.decode()
    response = outsider_client.post(start, {"workflow": support_base.workflow_id, "golden_set": support_set.pk,
                                            "mode": "gp", "population": 3, "generations": 2, "seed": 1})
    assert response.status_code == 200
    assert "Select a valid choice" in str(response.context["form"].errors["workflow"])
    assert EvolutionRun.objects.count() == 1 and not Promotion.objects.exists()
    assert EvolutionRun.objects.get(pk=small_run.pk).status == "completed"


def test_generations_and_individuals_are_read_only(staff_client, small_run):
    generation = Generation.objects.filter(evolution_run=small_run).first()
    individual = Individual.objects.filter(evolution_run=small_run).first()
    for model, pk in (("generation", generation.pk), ("individual", individual.pk), ("evolutionrun", small_run.pk)):
        assert staff_client.post(reverse(f"admin:evolution_{model}_change", args=[pk]), {}).status_code == 403
        assert staff_client.get(reverse(f"admin:evolution_{model}_add")).status_code == 403
        assert staff_client.post(reverse(f"admin:evolution_{model}_delete", args=[pk]),
                                 {"post": "yes"}).status_code == 403
    page = staff_client.get(reverse("admin:evolution_generation_change", args=[generation.pk])).content.decode()
    assert page.count(version_url(individual.workflow_version_id)) >= 1 and "&quot;run_evaluations&quot;" in page
    listing = staff_client.get(reverse("admin:evolution_individual_changelist") + f"?q={small_run.pk}")
    assert len(listing.context["cl"].result_list) == Individual.objects.filter(evolution_run=small_run).count()


# ------------------------------------------------------------------------------------------------- XSS

def test_user_text_is_escaped_on_every_page_and_inside_the_svgs(staff_client, workspace):
    run = synthetic_run(workspace, generations=2, per_generation=3, name=XSS, note=XSS_IMG, kind=XSS)
    EvolutionRun.objects.filter(pk=run.pk).update(goal_text=XSS_IMG, stop_reason=XSS, error=XSS_IMG)
    generation = Generation.objects.filter(evolution_run=run).first()
    individual = Individual.objects.filter(evolution_run=run).first()
    pages = {
        "run list": reverse("admin:evolution_evolutionrun_changelist"),
        "run": run_url(run),
        "start": reverse("admin:evolution_evolutionrun_start"),
        "generations": reverse("admin:evolution_generation_changelist"),
        "generation": reverse("admin:evolution_generation_change", args=[generation.pk]),
        "individuals": reverse("admin:evolution_individual_changelist"),
        "individual": reverse("admin:evolution_individual_change", args=[individual.pk]),
    }
    for name, url in pages.items():
        response = staff_client.get(url)
        assert response.status_code == 200, name
        html = response.content.decode()
        assert XSS not in html and XSS_IMG not in html, name
        assert "&lt;script&gt;" in html or "&lt;img" in html, name
    response = staff_client.get(pages["run"])
    genealogy = str(response.context["genealogy_svg"])
    assert "<script" not in genealogy and "<img" not in genealogy
    assert "kind: &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in genealogy  # the tooltips, escaped
    assert "note: &lt;img src=x onerror=alert(&quot;i&quot;)&gt;" in genealogy
    svg = str(charts.genealogy_svg([{"id": 1, "column": 0, "label": XSS, "url": f'"><script>{XSS}', "fitness": 1.0,
                                     "kind": XSS, "note": XSS_IMG, "operation": XSS, "parents": [], "base": True,
                                     "best": True}], title=XSS))
    assert "<script" not in svg and "<img" not in svg and 'href="&quot;&gt;&lt;script&gt;' in svg
    chart = str(charts.fitness_svg([{"number": 0, "best": 1.0, "avg": 0.5, "worst": 0.1}], title=XSS))
    assert "<script" not in chart and "&lt;script&gt;" in chart


# ---------------------------------------------------------------------------------------------- charts

def test_the_fitness_chart_has_a_point_per_generation_per_series_with_gaps_for_missing_values():
    generations = [{"number": n, "best": 10.0 + 10 * n, "avg": 5.0 + 5 * n, "worst": None if n == 2 else 1.0}
                   for n in range(4)]
    svg = str(charts.fitness_svg(generations, base_fitness=10.0))
    for key, expected in (("best", 4), ("avg", 4), ("worst", 3)):
        assert len(re.findall(f'class="evo-point evo-point-{key}"', svg)) == expected, key
    worst = re.search(r'evo-series-worst" data-series="worst">(.*?)</g>', svg).group(1)
    assert worst.count("<polyline") == 1  # points 0-1 joined, point 3 alone: the gap is not bridged
    ticks = re.findall(r'class="evo-tick" x="[\d.]+" y="[\d.]+" text-anchor="end">([\d.]+)</text>', svg)
    assert ticks == ["0", "10", "20", "30", "40"]  # round ticks from 0 above the highest point
    assert svg == str(charts.fitness_svg(generations, base_fitness=10.0))  # deterministic
    assert "no generation recorded yet" in str(charts.fitness_svg([]))
    many = str(charts.fitness_svg([{"number": n, "best": 1.0, "avg": 1.0, "worst": 1.0} for n in range(150)]))
    assert len(re.findall(r'class="evo-point evo-point-best"', many)) == 150
    assert len(re.findall(r'class="evo-tick" x="[\d.]+" y="[\d.]+" text-anchor="middle"', many)) <= 14


def test_the_genealogy_styles_edges_by_operation_and_draws_none_for_an_immigrant():
    nodes = [
        {"id": 1, "column": 0, "label": "base", "url": "/1/", "fitness": 10.0, "operation": "init", "parents": [],
         "base": True},
        {"id": 2, "column": 1, "label": "m", "url": "/2/", "fitness": 20.0, "operation": "mutation", "parents": [1]},
        {"id": 3, "column": 1, "label": "i", "url": "/3/", "fitness": 5.0, "operation": "immigrant", "parents": [1]},
        {"id": 4, "column": 2, "label": "x", "url": "/4/", "fitness": 40.0, "operation": "crossover",
         "parents": [2, 3], "best": True},
    ]
    svg = str(charts.genealogy_svg(nodes))
    edges = re.findall(r'<path class="evo-edge evo-edge-(\w+)( evo-edge-lineage)?" data-from="(\d+)" data-to="(\d+)"',
                       svg)
    assert sorted((kind, int(a), int(b), bool(line)) for kind, line, a, b in edges) == [
        ("crossover", 2, 4, True), ("crossover", 3, 4, True), ("mutation", 1, 2, True)]
    assert 'stroke-dasharray="4 3"' in svg  # crossover edges are dashed
    assert re.search(r'data-version="3".*?</title><rect', svg, re.S)  # an immigrant is a square
    assert re.search(r'data-version="4".*?</title>(<circle[^>]*fill="none"[^>]*/>)*<path d="M', svg, re.S)
    colours = dict(re.findall(r'data-version="(\d+)".*?</title>(?:<circle[^>]*fill="none"[^>]*/>)*<\w+ [^>]*'
                              r'fill="(#[0-9a-f]{6})"', svg, re.S))
    assert colours["4"] == "#fde725" and colours["3"] == "#440154"  # the top and the bottom of the scale
    assert ">5.00</text>" in svg and ">40.00</text>" in svg  # the legend's range
    assert ">base</text>" in svg and ">best</text>" in svg


# -------------------------------------------------------------------------------------- query budgets

def test_changelists_query_count_does_not_grow_with_rows(staff_client, workspace):
    synthetic_run(workspace, generations=1, per_generation=2, name="one")
    urls = [reverse(f"admin:evolution_{model}_changelist") for model in ("evolutionrun", "generation", "individual")]
    urls += [urls[0] + "?status__exact=completed", urls[2] + "?_facets=True"]
    before = [count_queries(staff_client, url) for url in urls]
    for number in range(6):
        synthetic_run(workspace, generations=3, per_generation=5, name=f"more {number}", seed=number)
    assert [count_queries(staff_client, url) for url in urls] == before


def test_the_run_page_query_count_does_not_grow_with_generations_individuals_or_versions(staff_client, workspace):
    small = synthetic_run(workspace, generations=2, per_generation=3, name="small")
    large = synthetic_run(workspace, generations=8, per_generation=25, name="large", seed=3)
    pages = [run_url(small), reverse("admin:evolution_generation_change", args=[small.generations.first().pk])]
    for url in pages:  # content types and the like are cached after a first visit
        count_queries(staff_client, url)
    big = [run_url(large), reverse("admin:evolution_generation_change", args=[large.generations.first().pk])]
    assert [count_queries(staff_client, url) for url in big] == [count_queries(staff_client, url) for url in pages]


# ----------------------------------------------------------------------------------- a big genealogy

def test_a_genealogy_of_300_versions_renders_compactly(staff_client, workspace):
    """300 versions: one node each, a bounded canvas and markup (its render time is a benchmark's
    business, not a test's)."""
    run = synthetic_run(workspace, generations=10, per_generation=30, name="big", seed=11)
    versions = Individual.objects.filter(evolution_run=run).values("workflow_version").distinct().count()
    assert versions == 300
    response = staff_client.get(run_url(run))
    assert response.status_code == 200
    svg = str(response.context["genealogy_svg"])
    assert len(re.findall(r'<a class="evo-node', svg)) == 300
    width, height = (float(v) for v in re.match(r'<svg [^>]*width="(\d+)" height="(\d+)"', svg).groups())
    assert width <= 1400 and height <= 800  # ten columns of 30: no sprawling canvas
    assert len(svg) < 350_000  # bytes of markup: about a kilobyte a version, edges included
    nodes = [{"id": n, "column": n // 100, "label": f"v{n}", "url": f"/{n}/", "fitness": float(n % 97),
              "operation": "mutation", "parents": [n - 100] if n >= 100 else []} for n in range(300)]
    tall = str(charts.genealogy_svg(nodes))
    # 100 versions in one generation wrap into sub-columns instead of a 1,700-pixel column
    assert float(re.match(r'<svg [^>]*height="(\d+)"', tall).group(1)) <= 800
    assert len(re.findall(r'<a class="evo-node', tall)) == 300
