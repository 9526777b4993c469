"""Eval runs as durable runs.

``evals.run`` scores a workflow version on a golden set: results it may reuse are recorded first;
the other items are dealt round-robin to `concurrency` lanes (child runs of ``evals.lane``, joined
with ``ctx.all``: the eval run wakes once, when every lane has ended; a lane that failed fails the
run then, never cutting the other lanes' items short). A lane takes its items one after the other:
the item's invocation (a child run of ``workflows.invoke``), then its grading in a step, every call
of its judge in a step of its own (so grading redone after a crash never pays the judge twice). So
`concurrency` items are in flight at any time, no lane waits for another's slowest item, and no run
replays a history longer than its own share of the items (a 1,000-item eval run at concurrency 128
is 128 lanes of about 8 items, not one history of thousands of checkpoints). A crashed or retried
eval run resumes where it stopped: finished invocations and graded items are never redone.
A run given a budget of its own (`run_usd_budget`: an evolution passes down what it has left)
starts no item once its invocations and judge have spent it (each lane checks before each item),
and fails saying so.
"""

from __future__ import annotations

import contextlib
from decimal import Decimal
from typing import NotRequired, TypedDict, cast

from durable import Child, ChildFailed, Context, StepFailed, workflow
from durable.owners import begin_row, fail_row, join_row
from evals import execution
from evals.models import EvalRun
from workflows.durable_workflows import INVOKE_WORKFLOW, model_call_options

EVAL_WORKFLOW = "evals.run"
LANE_WORKFLOW = "evals.lane"


class LaneInput(TypedDict):
    eval_run_id: int
    items: list[int]  # in order
    keys: dict[str, str]  # item id -> reuse key
    run_usd_budget: str | None


class LaneResult(TypedDict):
    items: NotRequired[int]  # all run
    budget_spent: NotRequired[str]  # why the items left were not started


class BudgetSpent(Exception):
    """The eval run's own USD budget is spent: the items left are not started."""


@workflow(EVAL_WORKFLOW)  # started by evals.services.eval_run_start only
def eval_run(ctx: Context, input: dict) -> dict:
    """Input: {"eval_run_id": int}."""
    eval_run_id = int(input["eval_run_id"])
    plan = begin_row(ctx, EvalRun, eval_run_id)
    if "ended" in plan:
        return {"status": plan["ended"]}
    plan = cast(execution.EvalPlan, plan)  # begin's plan, once not ended
    try:
        pending = plan["pending"]
        lanes = min(max(1, plan["concurrency"]), len(pending))
        # every lane runs to its end even when another fails: a failure cancelling the others would cut
        # their items short mid-invocation (paid for, then ended by the reconcile and, after a retry,
        # graded as the version's failure)
        ended = ctx.all([Child(LANE_WORKFLOW, lane_input(eval_run_id, plan, pending[lane::lanes]), name=f"lane:{lane}")
                         for lane in range(lanes)], return_exceptions=True)
        failed = [lane for lane in ended if isinstance(lane, Exception)]
        if failed:
            raise failed[0]
        spent = [lane["budget_spent"] for lane in ended if lane.get("budget_spent")]
        if spent:
            raise BudgetSpent(spent[0])
        summary = ctx.transaction("finish", execution.eval_finish, eval_run_id)
    except Exception as exc:
        fail_row(ctx, EvalRun, eval_run_id, exc)
        execution.trace_eval_run(eval_run_id, error=f"{type(exc).__name__}: {exc}")
        raise
    return summary


def lane_input(eval_run_id: int, plan: execution.EvalPlan, items: list[int]) -> LaneInput:
    return {"eval_run_id": eval_run_id, "items": items, "keys": {str(item): plan["keys"][str(item)] for item in items},
            "run_usd_budget": plan.get("run_usd_budget")}


@workflow(LANE_WORKFLOW)  # started by evals.run only, as its child
def eval_lane(ctx: Context, input: LaneInput) -> LaneResult:
    """Input: {"eval_run_id", "items": [item ids, in order], "keys": {item: reuse key}, "run_usd_budget"}.
    Invokes and grades the items one after the other; stops before an item once the run's own
    budget is spent, returning {"budget_spent": why}. A lane retried on its own after its run ended
    fails before its next item (execution.EvalRunEnded): a completed lane would be a lane its run's own
    retry never runs again, its items left unscored."""
    eval_run_id, items, budget = int(input["eval_run_id"]), list(input["items"]), input.get("run_usd_budget")
    join_row(ctx, EvalRun, eval_run_id)
    for done, item in enumerate(items):
        if budget is not None:
            spent = Decimal(ctx.step(f"spent:{item}", execution.eval_spent, eval_run_id))
            if execution.usd_budget_spent(spent, Decimal(budget)):
                return {"budget_spent": f"USD budget spent: ${spent:.6f} of ${Decimal(budget):.6f}; this lane "
                                        f"had run {done} of its {len(items)} items, the others were not started"}
        try:
            invocation = ctx.transaction(f"invocation:{item}", execution.eval_invocations_create, eval_run_id,
                                         [item], ctx.run_id)[str(item)]
        except execution.EvalRunEnded as exc:
            raise execution.EvalRunEnded(f"{exc}; this lane had run {done} of its {len(items)} items, the others "
                                         "were not started") from None
        with contextlib.suppress(ChildFailed):  # the invocation recorded its failure: graded as the version's (0)
            ctx.child(INVOKE_WORKFLOW, {"invocation_id": invocation}, name=f"item:{item}")
        grade_item(ctx, eval_run_id, item, invocation, input["keys"][str(item)])
    return {"items": len(items)}


def grade_item(ctx: Context, eval_run_id: int, item: int, invocation_id: int, key: str) -> None:
    """Grade one item in a step; while the grading needs one more judge answer, make that call in a
    step of its own and grade again with every answer so far (a judge's step that failed is an
    answer too: the call's error, so a grading error of this item, not a failed lane)."""
    judged: list[execution.JudgeAnswer] = []
    args = (eval_run_id, item, invocation_id, key)
    outcome: execution.GradeOutcome
    outcome = ctx.step(f"grade:{item}", execution.eval_grade_item, *args, [])
    while "judge" in outcome:
        name = f"judge:{item}:{len(judged)}"
        try:
            judged.append(ctx.step(name, execution.judge_call, outcome["judge"], f"{ctx.run_id}:{name}",
                                   **model_call_options(outcome["judge"]["model"])))
        except StepFailed as exc:  # put off too long, or timed out too often: the judge failed this item
            judged.append({"error": str(exc)})
        outcome = ctx.step(f"grade:{item}:{len(judged)}", execution.eval_grade_item, *args, list(judged))


REEVALUATE_WORKFLOW = "evals.reevaluate"


@workflow(REEVALUATE_WORKFLOW)  # started by its schedule (evals.services.reevaluation_schedule_save)
def reevaluate(ctx: Context, input: dict | None = None) -> dict:
    """Re-evaluate the active version of every golden set's workflow in the run's workspace (each
    an eval run, as a child run) and flag each that dropped significantly since its previous run."""
    created: execution.ReevaluationRuns
    created = ctx.transaction("runs", execution.reevaluation_runs_create, ctx.namespace, ctx.run_id)
    runs = created["runs"]
    ctx.all([Child(EVAL_WORKFLOW, {"eval_run_id": run_id}, name=f"eval:{run_id}") for run_id in runs],
            return_exceptions=True)
    checks = {str(run_id): ctx.step(f"check:{run_id}", execution.regression_check, run_id) for run_id in runs}
    return {"runs": runs, "skipped": created["skipped"],
            "dropped": [int(run_id) for run_id, check in checks.items() if check.get("dropped")]}
