"""Reads of the evolution app."""

from __future__ import annotations

from django.db.models.expressions import RawSQL

from evolution.models import EvolutionRun, Individual
from workflows.models import WorkflowVersion


def best_lineage(run: EvolutionRun) -> list[dict]:
    """The run's best version back to its base (or to a root: an immigrant has no parent), following
    the first parent, oldest first: each step's operation, what the operator did, its fitness in this
    run and the change from the step before (which operation helped)."""
    if run.best_version_id is None:
        return []
    fitness: dict[int, float] = {}
    made: dict[int, tuple[str, str]] = {}
    for version_id, value, kind, note in Individual.objects.filter(evolution_run=run) \
            .values_list("workflow_version_id", "fitness", "kind", "note"):
        if value is not None:
            fitness[version_id] = max(value, fitness.get(version_id, value))
        made.setdefault(version_id, (kind, note))
    from workflows.selectors import version_ancestors

    chain_ids = [run.best_version_id, *(pk for pk, _ in version_ancestors(run.best_version_id, max_depth=1000))]
    versions = WorkflowVersion.objects.in_bulk(chain_ids)
    path, current = [], versions.get(run.best_version_id)
    while current is not None:
        path.append(current)
        if current.pk == run.base_version_id:
            break
        current = versions.get(current.parent1_id) if current.parent1_id else None
    path.reverse()
    steps, previous = [], None
    for version in path:
        value = fitness.get(version.pk)
        kind, note = made.get(version.pk, ("", ""))
        steps.append({"version_id": version.pk, "operation": version.operation, "kind": kind, "note": note,
                      "parent2_id": version.parent2_id, "fitness": value,
                      "change": None if value is None or previous is None else round(value - previous, 6)})
        previous = value if value is not None else previous
    return steps


ANCESTOR_DEPTH = 200  # how far the genealogy climbs from the run's versions towards the base


def run_genealogy_versions(run: EvolutionRun):
    """The versions of a run's genealogy: every version that took part, and their ancestors (of the
    run's workflow) back to the base, the base's own left out. One recursive query."""
    version_table = WorkflowVersion._meta.db_table
    sql = f"""
        WITH RECURSIVE lineage(id, depth) AS (
            SELECT individual.workflow_version_id, 0 FROM {Individual._meta.db_table} AS individual
            WHERE individual.evolution_run_id = %s
            UNION
            SELECT parent.id, lineage.depth + 1 FROM lineage
            JOIN {version_table} AS child ON child.id = lineage.id
            JOIN {version_table} AS parent ON parent.id = child.parent1_id OR parent.id = child.parent2_id
            WHERE child.id <> %s AND parent.workflow_id = %s AND lineage.depth < %s
        )
        SELECT id FROM lineage
    """
    # the table names come from the models; every value is a bound parameter
    lineage = RawSQL(sql, (run.pk, run.base_version_id, run.workflow_id, ANCESTOR_DEPTH))  # noqa: S611
    return (WorkflowVersion.objects.filter(pk__in=lineage)
            .only("pk", "dsl_hash", "operation", "parent1", "parent2", "status", "workflow")
            .order_by("pk"))
