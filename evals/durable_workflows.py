"""Eval runs as durable runs.

``evals.run`` scores a workflow version on a golden set: results it may reuse are recorded first;
the other items run in batches of `concurrency` workflow invocations (child runs of
``workflows.invoke``, joined with ``ctx.all``), then each is graded in its own step, every call of
its judge in a step of its own (so grading redone after a crash never pays the judge twice). A crashed
eval run resumes where it stopped: finished invocations and graded items are never redone. A run
given a budget of its own (`run_usd_budget`: an evolution passes down what it has left) starts no
batch once its invocations and judge have spent it, and fails saying so.
"""

from __future__ import annotations

from decimal import Decimal

from durable import workflow
from durable.engine import Child
from evals import execution
from workflows.durable_workflows import INVOKE_WORKFLOW, begin_row, describe

EVAL_WORKFLOW = "evals.run"


class BudgetSpent(Exception):
    """The eval run's own USD budget is spent: the items left are not started."""


@workflow(EVAL_WORKFLOW)  # started by evals.services.eval_run_start only
def eval_run(ctx, input: dict) -> dict:
    """Input: {"eval_run_id": int}."""
    eval_run_id = int(input["eval_run_id"])
    plan = begin_row(ctx, execution.eval_begin, execution.eval_fail, eval_run_id)
    if "ended" in plan:
        return {"status": plan["ended"]}
    try:
        pending, cap = plan["pending"], max(1, plan["concurrency"])
        budget = plan.get("run_usd_budget")
        for batch_number, start in enumerate(range(0, len(pending), cap)):
            if budget is not None:
                spent = Decimal(ctx.step(f"spent:{batch_number}", execution.eval_spent, eval_run_id))
                if execution.usd_budget_spent(spent, Decimal(budget)):
                    raise BudgetSpent(f"USD budget spent: ${spent:.6f} of ${Decimal(budget):.6f} after {start} of "
                                      f"{len(pending)} items to run; the others were not started")
            batch = pending[start:start + cap]
            invocations = ctx.transaction(f"invocations:{batch_number}", execution.eval_invocations_create,
                                          eval_run_id, batch)
            ctx.all([Child(INVOKE_WORKFLOW, {"invocation_id": invocations[str(item)]}, name=f"item:{item}")
                     for item in batch], return_exceptions=True)
            for item in batch:
                grade_item(ctx, eval_run_id, item, invocations[str(item)], plan["keys"][str(item)])
        summary = ctx.transaction("finish", execution.eval_finish, eval_run_id)
    except Exception as exc:
        ctx.step("fail", execution.eval_fail, eval_run_id, describe(exc))
        raise
    return summary


def grade_item(ctx, eval_run_id: int, item: int, invocation_id: int, key: str) -> None:
    """Grade one item in a step; while the grading needs one more judge answer, make that call in a
    step of its own and grade again with every answer so far."""
    judged: list[dict] = []
    args = (eval_run_id, item, invocation_id, key)
    outcome = ctx.step(f"grade:{item}", execution.eval_grade_item, *args, [])
    while "judge" in outcome:
        judged.append(ctx.step(f"judge:{item}:{len(judged)}", execution.judge_call, outcome["judge"]))
        outcome = ctx.step(f"grade:{item}:{len(judged)}", execution.eval_grade_item, *args, list(judged))


REEVALUATE_WORKFLOW = "evals.reevaluate"


@workflow(REEVALUATE_WORKFLOW)  # started by its schedule (evals.services.reevaluation_schedule_save)
def reevaluate(ctx, input: dict | None = None) -> dict:
    """Re-evaluate the active version of every golden set's workflow in the run's workspace (each
    an eval run, as a child run) and flag each that dropped significantly since its previous run."""
    created = ctx.transaction("runs", execution.reevaluation_runs_create, ctx.namespace, ctx.run_id)
    runs = created["runs"]
    ctx.all([Child(EVAL_WORKFLOW, {"eval_run_id": run_id}, name=f"eval:{run_id}") for run_id in runs],
            return_exceptions=True)
    checks = {str(run_id): ctx.step(f"check:{run_id}", execution.regression_check, run_id) for run_id in runs}
    return {"runs": runs, "skipped": created["skipped"],
            "dropped": [int(run_id) for run_id, check in checks.items() if check.get("dropped")]}
