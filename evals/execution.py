"""The writes of an eval run, each called as one durable step by evals/durable_workflows.py.

Idempotent like the workflow runner's: results are unique per (run, item) and written with
ignore-conflicts; an item's invocation is created in a ``ctx.transaction`` (exactly once);
aggregates are recomputed from the results.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import NotRequired, TypedDict

from django.db import transaction
from django.db.models import Sum

from config import telemetry
from durable.states import RunStatus
from evals.models import EvalRun, GoldenItem, GoldenResult
from evals.stats import fitness, percentile
from workflows.models import WorkflowInvocation
from workspaces.models import Workspace


def now() -> datetime:
    return datetime.now(UTC)


def reuse_key(version_id: int, item_hash: str, graders_digest: str) -> str:
    """What a result depends on: the version (its genome), the item's contents and the grading."""
    return hashlib.sha256(f"{version_id}:{item_hash}:{graders_digest}".encode()).hexdigest()


def grading_digest(graders: list[dict], judge_model: str | None) -> str:
    """The graders and who judges: the judge's model as this installation resolves it (the offline
    fallback when the offline provider answers), so a result graded by another judge is not reused."""
    from evals.graders import graders_hash
    from llm.errors import ChatError
    from llm.names import resolve_model

    try:
        resolved = resolve_model(judge_model) if judge_model else None
        judge = f"{resolved.provider}:{resolved.model}" if resolved else "-"
    except ChatError:
        judge = f"unresolved:{judge_model}"
    return f"{graders_hash(graders)}:{judge}"


def output_text(output) -> str:
    """The text of an invocation's output that graders read."""
    if isinstance(output, dict) and isinstance(output.get("text"), str):
        return output["text"]
    if output is None:
        return ""
    return output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)


class EvalPlan(TypedDict):
    """What an eval run reads of its row, from the checkpoint of its `begin` step."""

    pending: list[int]  # the items left to run, in the set's order
    keys: dict[str, str]  # item id -> reuse key
    concurrency: int
    reused: int
    run_usd_budget: str | None  # Decimal as text


def eval_plan(run: EvalRun) -> EvalPlan:
    """An eval run that begins (durable.owners.begin calls it, the row locked and marked running):
    record the results it reuses and return the items left to run."""
    items = GoldenItem.objects.filter(golden_set_id=run.golden_set_id)
    if run.config.get("item_ids"):  # a minibatch: only these items of the set
        items = items.filter(pk__in=run.config["item_ids"])
    items = list(items.order_by("position", "id").values_list("pk", "content_hash"))
    digest = grading_digest(run.config["graders"], run.config.get("judge_model"))
    keys = {pk: reuse_key(run.workflow_version_id, content, digest) for pk, content in items}
    reused = {}
    if run.reuse:
        # a graded answer of a completed invocation: a failure may be this run's budget or an outage
        earlier = GoldenResult.objects.filter(reuse_key__in=list(keys.values()), grading_error=False,
                                              workflow_invocation__status=WorkflowInvocation.Status.COMPLETED) \
            .exclude(eval_run=run).order_by("reuse_key", "-created_at").distinct("reuse_key")
        by_key = {result.reuse_key: result for result in earlier}
        rows = []
        for pk, key in keys.items():
            source = by_key.get(key)
            if source is None:
                continue
            reused[pk] = source.pk
            rows.append(GoldenResult(
                eval_run=run, golden_item_id=pk, workflow_version_id=run.workflow_version_id,
                workflow_invocation_id=source.workflow_invocation_id, actual_output=source.actual_output,
                score=source.score,
                passed=None if source.score is None else source.score >= run.config["threshold"],
                grading_rationale=source.grading_rationale, grader=source.grader, grades=source.grades,
                error=source.error, latency_ms=source.latency_ms, usd_cost=source.usd_cost, judge_usd=0,
                reuse_key=key, reused_from_id=source.reused_from_id or source.pk))
        GoldenResult.objects.bulk_create(rows, ignore_conflicts=True)
    run.items_total = len(items)
    run.items_reused = len(reused)
    run.save(update_fields=["items_total", "items_reused", "updated_at"])
    _progress(run.pk)
    return {"pending": [pk for pk, _ in items if pk not in reused], "keys": {str(k): v for k, v in keys.items()},
            "concurrency": int(run.config.get("concurrency", 4)), "reused": len(reused),
            "run_usd_budget": run.config.get("run_usd_budget")}


def usd_budget_spent(spent: Decimal, budget: Decimal) -> bool:
    """Whether `spent` used up `budget`. Nothing spent never has (so a free model runs on a zero
    budget, which then stops at the first paid call)."""
    return spent > 0 and spent >= budget


def eval_spent(eval_run_id: int) -> str:
    """What the eval run has paid so far, whatever became of it: its item invocations (each written
    naming the lane that runs it as its parent, a child of the run's run, of this history or an
    earlier one; results reused from earlier runs cost nothing now) and its judge's calls."""
    from durable.models import DurableRun

    run = EvalRun.objects.filter(pk=eval_run_id).values("durable_run_id").first()
    invocations = Decimal(0)
    if run and run["durable_run_id"]:
        # the lanes' ids first: as a subquery, Postgres may plan the join as a scan of every invocation for
        # each lane on tables it has not analysed yet (seconds a call late in a long transaction)
        lanes = list(DurableRun.objects.filter(parent_id=run["durable_run_id"]).values_list("pk", flat=True))
        invocations = WorkflowInvocation.objects.filter(parent_run_id__in=lanes) \
            .aggregate(total=Sum("usd_cost"))["total"] or Decimal(0)
    judge = GoldenResult.objects.filter(eval_run_id=eval_run_id).aggregate(total=Sum("judge_usd"))["total"]
    return f"{invocations + (judge or Decimal(0)):f}"


class EvalRunEnded(Exception):
    """A lane was asked to start an item of an eval run that has ended. Raised, never returned: nothing
    is checkpointed, so the lane fails (retryable) and a retry of its eval run runs the item after all."""


def eval_invocations_create(eval_run_id: int, item_ids: list[int], lane_run_id: str) -> dict[str, int]:
    """The invocations of items (run in a ``ctx.transaction``: created exactly once), each naming
    the lane that writes it as its parent (the run that starts the item's run: its end, before the
    item's run began, is the reconcile's sign that nothing will). Returns {item id: invocation id}.
    Raises EvalRunEnded, with nothing created or recorded, once the eval run's durable run has ended (a
    lane retried on its own after its eval run failed or was cancelled starts no item of it; a retried
    eval run is active again, its row still says how it ended until it ends anew)."""
    # only the columns it writes from: an item of every lane comes through here, and the version's graph,
    # the run's history and the items' other fields are not read
    run = EvalRun.objects.filter(pk=eval_run_id).values(
        "workspace_id", "workflow_version_id", "config", "created_by_id", "durable_run__status").get()
    status = run["durable_run__status"]
    if status is not None and status not in RunStatus.ACTIVE:
        raise EvalRunEnded(f"eval run {eval_run_id} {status}: retry the eval run, not its lane")
    inputs = dict(GoldenItem.objects.filter(pk__in=item_ids).values_list("pk", "input"))
    out: dict[str, int] = {}
    for item_id in item_ids:
        invocation = WorkflowInvocation.objects.create(
            workspace_id=run["workspace_id"], workflow_version_id=run["workflow_version_id"], input=inputs[item_id],
            node_budget=run["config"]["node_budget"], usd_budget=Decimal(run["config"]["usd_budget"]),
            parent_run_id=lane_run_id, created_by_id=run["created_by_id"])
        out[str(item_id)] = invocation.pk
    return out


class GradeOutcome(TypedDict, total=False):
    """An item graded ({"score"}), or the judge's call its grading needs first ({"judge": request})."""

    score: float | None
    judge: dict  # a ChatRequest's fields


def eval_grade_item(eval_run_id: int, item_id: int, invocation_id: int, key: str,
                    judged: list[JudgeAnswer] | None = None) -> GradeOutcome:
    """Grade one item's invocation and append its result. A failed invocation scores 0 (the
    version's failure); a grader that could not grade leaves the score empty (a grading error).
    The judge is answered from `judged` (what judge_call returned for its calls so far, in order):
    when the grading needs one call more, nothing is written and {"judge": request} says which,
    for the caller to make it in a step of its own and grade again. Returns {"score"} once graded."""
    from evals.graders import ItemSpec, JudgePending, grade

    existing = GoldenResult.objects.filter(eval_run_id=eval_run_id, golden_item_id=item_id).first()
    if existing is not None:
        return {"score": existing.score}
    run = EvalRun.objects.select_related("workflow_version").get(pk=eval_run_id)
    item = GoldenItem.objects.get(pk=item_id)
    invocation = WorkflowInvocation.objects.get(pk=invocation_id)
    latency = None
    if invocation.started_at and invocation.ended_at:
        latency = (invocation.ended_at - invocation.started_at).total_seconds() * 1000
    fields = {"eval_run": run, "golden_item": item, "workflow_version_id": run.workflow_version_id,
              "workflow_invocation": invocation, "latency_ms": latency, "usd_cost": invocation.usd_cost,
              "reuse_key": key}
    if invocation.status != WorkflowInvocation.Status.COMPLETED:
        result = GoldenResult(**fields, score=0.0, passed=False, grader="none",
                              error=f"the invocation {invocation.status}: {invocation.error}"[:5000],
                              grading_rationale="The workflow gave no answer, so the item scores 0.")
    else:
        actual = output_text(invocation.output)
        try:
            verdict = grade(actual, ItemSpec(input=item.input, expected_output=item.expected_output,
                                             scoring_criteria=item.scoring_criteria, rubric=tuple(item.rubric or ()),
                                             tags=tuple(item.tags or ()), metadata=item.metadata or {}),
                            run.config["graders"], output_schema=run.workflow_version.output_schema or None,
                            judge_model=run.config.get("judge_model"), judge=_recorded_judge(judged or []))
        except JudgePending as pending:
            return {"judge": _request_dict(pending.request)}
        result = GoldenResult(
            **fields, actual_output=actual, score=verdict.score,
            passed=None if verdict.score is None else verdict.score >= run.config["threshold"],
            grading_rationale=verdict.rationale, grader=verdict.grader[:200],
            grades=verdict.as_dict()["grades"], error=verdict.error, grading_error=bool(verdict.error),
            judge_usd=verdict.usage.usd_cost)
    with transaction.atomic():
        GoldenResult.objects.bulk_create([result], ignore_conflicts=True)
        _progress(eval_run_id)
    return {"score": result.score}


class JudgeResponse(TypedDict):
    response: dict  # ChatResponse.as_dict()


class JudgeFailure(TypedDict):
    error: str


JudgeAnswer = JudgeResponse | JudgeFailure  # one call of the judge, as its step recorded it


def judge_call(request: dict, caller: str = "") -> JudgeAnswer:
    """One call of the judge (`request` as eval_grade_item asked for it), made in a step of its own: a
    grading redone after a crash is answered from its checkpoint and never pays the judge twice.
    Returns {"response": ChatResponse.as_dict()} or, the call failing, {"error": why}.

    On a real provider it is a queued step (the llm queue's worker makes it): no database connection
    is held while the judge answers, and a provider limit, 429 or 5xx puts the step off on a durable
    timer (TryLater) instead of waiting in a worker's thread. `caller` names the call across its tries."""
    from durable import TryLater, deferrals, release_connection
    from llm.chat import PutOff, chat
    from llm.errors import CallPutOff, ChatError
    from llm.types import ChatRequest

    release_connection()
    try:
        response, _ = chat(ChatRequest(**request),
                           put_off=PutOff(caller=caller, retries_done=deferrals("provider")) if caller else None)
    except CallPutOff as exc:
        raise TryLater(exc.reason, after=exc.retry_in, kind=exc.kind) from None
    except ChatError as exc:
        return {"error": str(exc)}
    return {"response": response.as_dict()}


def _recorded_judge(answers: list[JudgeAnswer]):
    """A judge for ``grade`` answering from the recorded calls, in order; past them, JudgePending."""
    from evals.graders import JudgePending
    from llm.errors import ChatError
    from llm.types import ChatResponse

    left = list(answers)

    def answer(request):
        if not left:
            raise JudgePending(request)
        recorded = left.pop(0)
        if "error" in recorded:
            raise ChatError(recorded["error"])
        return ChatResponse.from_dict(recorded["response"])

    return answer


def _request_dict(request) -> dict:
    if request.tools:
        raise ValueError("a judge's request offers no tools")
    return {"model": request.model, "messages": request.messages, "response_format": request.response_format,
            "temperature": request.temperature, "max_tokens": request.max_tokens}


def _progress(eval_run_id: int) -> None:
    # in the transaction that wrote a result; lanes grade at once, so the count waits for the run's row:
    # counted before another lane's result committed, it would then overwrite that lane's count
    EvalRun.objects.select_for_update(no_key=True).filter(pk=eval_run_id).values_list("pk").first()
    done = GoldenResult.objects.filter(eval_run_id=eval_run_id).count()
    EvalRun.objects.filter(pk=eval_run_id).update(items_done=done, updated_at=now())


def eval_finish(eval_run_id: int) -> dict:
    """Aggregate the results: average score and pass rate (over graded items), costs, latency
    percentiles and fitness; the version keeps its latest average and pass rate. Run in a
    ``ctx.transaction``, so only a turn that still holds the run commits it: a failed or cancelled
    row is completed too (an operator retried its run, and the run is what happened)."""
    from workflows.models import WorkflowVersion

    run = EvalRun.objects.get(pk=eval_run_id)
    results = list(GoldenResult.objects.filter(eval_run=run).values("score", "passed", "latency_ms", "usd_cost",
                                                                      "judge_usd", "grading_error", "reused_from"))
    scored = [r for r in results if r["score"] is not None]
    avg = sum(r["score"] for r in scored) / len(scored) if scored else None
    pass_rate = sum(1 for r in scored if r["passed"]) / len(scored) if scored else None
    cost = sum((r["usd_cost"] for r in results), Decimal(0))
    paid = sum((r["usd_cost"] for r in results if r["reused_from"] is None), Decimal(0))
    judge = GoldenResult.objects.filter(eval_run=run).aggregate(total=Sum("judge_usd"))["total"] or Decimal(0)
    latencies = [r["latency_ms"] for r in results if r["latency_ms"] is not None]
    seconds = (sum(latencies) / len(latencies) / 1000) if latencies else 0.0
    score = None
    if avg is not None:
        score = fitness(avg, seconds_per_item=seconds, usd_per_item=float(cost) / max(1, len(results)))
    fields = dict(
        status=EvalRun.Status.COMPLETED, avg_score=None if avg is None else round(avg, 6),
        pass_rate=None if pass_rate is None else round(pass_rate, 6), usd_cost=cost, paid_usd=paid, judge_usd=judge,
        latency_p50_ms=percentile(latencies, 50), latency_p95_ms=percentile(latencies, 95), fitness=score,
        items_done=len(results), grading_errors=sum(1 for r in results if r["grading_error"]),
        ended_at=now(), updated_at=now())
    with transaction.atomic():
        EvalRun.objects.filter(pk=eval_run_id).exclude(status=EvalRun.Status.COMPLETED).update(**fields, error="")
        if avg is not None and not run.config.get("item_ids"):  # a minibatch is not the version's score
            WorkflowVersion.objects.filter(pk=run.workflow_version_id).update(
                avg_score=fields["avg_score"], pass_rate=fields["pass_rate"], updated_at=now())
    trace_eval_run(eval_run_id)
    return {"avg_score": fields["avg_score"], "pass_rate": fields["pass_rate"], "fitness": score,
            "items": len(results), "grading_errors": fields["grading_errors"]}


def trace_eval_run(eval_run_id: int, *, error: str = "") -> None:
    """The eval run's span, recorded once as it ends (completed, or failed by its run's last turn), under its
    run's trace: its lanes and their items' invocations ran in the same trace."""
    if not telemetry.tracing():
        return
    row = EvalRun.objects.filter(pk=eval_run_id).values(
        "started_at", "created_at", "status", "avg_score", "pass_rate", "usd_cost", "items_done", "items_total",
        "grading_errors", "workflow_version_id", "golden_set__name").first()
    if row is None:
        return
    attributes = {"lineage.eval_run.id": eval_run_id, "lineage.golden_set": row["golden_set__name"],
                  "lineage.workflow_version.id": row["workflow_version_id"], "lineage.eval_run.status": row["status"],
                  "lineage.items_done": row["items_done"], "lineage.items_total": row["items_total"],
                  "lineage.grading_errors": row["grading_errors"], "lineage.usd_cost": float(row["usd_cost"])}
    attributes.update({f"lineage.{name}": row[name] for name in ("avg_score", "pass_rate") if row[name] is not None})
    telemetry.record_span(f"eval_run {row['golden_set__name']}", key=f"eval_run:{eval_run_id}",
                          start=row["started_at"] or row["created_at"], attributes=attributes, error=error,
                          error_type="failed" if error else "")


class ReevaluationRuns(TypedDict):
    runs: list[int]  # the eval runs created
    skipped: list[str]  # why a golden set has none


def reevaluation_runs_create(namespace: str, parent_run_id: str | None = None) -> ReevaluationRuns:
    """The eval runs of a scheduled re-evaluation (in a ``ctx.transaction``: created once): one per
    golden set of the namespace's workspace whose workflow has an active version that can run here,
    results not reused (the point is to see drift), each naming `parent_run_id` (the re-evaluation's
    run) as its parent. Returns {"runs": [ids], "skipped": [reasons]}."""
    from evals.models import GoldenSet
    from evals.services import EvalError, eval_run_prepare
    from workflows.models import WorkflowVersion

    runs: list[int] = []
    skipped: list[str] = []
    sets = GoldenSet.objects.filter(workspace_id=Workspace.id_of_namespace(namespace), workflow__isnull=False)
    for golden in sets.select_related("workspace").order_by("pk"):
        version = WorkflowVersion.objects.filter(workflow_id=golden.workflow_id, status=WorkflowVersion.Status.ACTIVE) \
            .select_related("workflow").first()
        if version is None or not golden.items.exists():
            continue
        try:
            run = eval_run_prepare(golden_set=golden, version=version, reuse=False, origin=EvalRun.Origin.SCHEDULE,
                                   parent_run_id=parent_run_id)
        except EvalError as exc:
            skipped.append(f"{golden.name}: {exc}")
            continue
        runs.append(run.pk)
    return {"runs": runs, "skipped": skipped}


class RegressionCheck(TypedDict):
    checked: bool
    reason: NotRequired[str]  # why it was not checked
    dropped: NotRequired[bool]
    previous_run: NotRequired[int]
    verdict: NotRequired[str]


def regression_check(eval_run_id: int) -> RegressionCheck:
    """Compare a re-evaluation with the previous completed run of the same version on the same set
    (paired test); a significant drop is recorded on the run (`regression`)."""
    from evals.conf import eval_settings
    from evals.stats import paired_comparison

    run = EvalRun.objects.get(pk=eval_run_id)
    if run.status != EvalRun.Status.COMPLETED:
        return {"checked": False, "reason": f"the run {run.status}"}
    previous = EvalRun.objects.filter(golden_set_id=run.golden_set_id, workflow_version_id=run.workflow_version_id,
                                      status=EvalRun.Status.COMPLETED, ended_at__lt=run.ended_at) \
        .exclude(pk=run.pk).order_by("-ended_at").first()
    if previous is None:
        return {"checked": False, "reason": "no earlier run to compare with"}
    before = dict(GoldenResult.objects.filter(eval_run=previous).values_list("golden_item_id", "score"))
    after = dict(GoldenResult.objects.filter(eval_run=run).values_list("golden_item_id", "score"))
    paired = sorted(pk for pk in before if before[pk] is not None and after.get(pk) is not None)
    conf = eval_settings()
    comparison = paired_comparison([before[pk] for pk in paired], [after[pk] for pk in paired], alpha=conf.alpha,
                                   resamples=conf.bootstrap_resamples)
    dropped = comparison.verdict == "worse"
    if dropped:
        EvalRun.objects.filter(pk=run.pk).update(regression={"previous_run": previous.pk,
                                                             "comparison": comparison.as_dict()}, updated_at=now())
    return {"checked": True, "dropped": dropped, "previous_run": previous.pk, "verdict": comparison.verdict}
