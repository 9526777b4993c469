"""manage.py eval SET VERSION: run a golden set against a workflow version with a progress bar, then
print the per-item results and the summary."""

import sys
import time

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Max, Q
from kombu.exceptions import KombuError

from config import display
from durable.management.commands.durable import table
from evals.conf import MAX_CONCURRENCY
from evals.models import EvalRun, GoldenResult
from evals.selectors import golden_set_lookup, score_histogram
from evals.services import EvalError, eval_run_start
from workflows.selectors import version_lookup


def progress_bar(done: int, total: int, width: int = 30) -> str:
    filled = width * done // total if total else 0
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


STALL_SECONDS = 60.0  # a serving worker renews its run's lease every few seconds and each item settles its row
WORKERS_ASKED_EVERY = 5.0  # seconds between two questions to the workers while this process cannot drive


def serving_queues(timeout: float = 1.0) -> set[str]:
    """The queues the Celery workers that answer within `timeout` consume (empty when none answers or the
    broker is down)."""
    from config.celery import app

    try:
        replies = app.control.inspect(timeout=timeout).active_queues() or {}
    except (OSError, KombuError):  # a broker that cannot be reached: no worker serves
        return set()
    return {queue["name"] for queues in replies.values() for queue in queues or ()}


def run_needs(run: EvalRun) -> set[str]:
    """The queues the eval run's work is sent to: turns, and the queues of the queued steps it waits on."""
    from durable.models import DurableRun, StepCheckpoint
    from durable.settings import durable_settings

    tree = DurableRun.objects.filter(Q(pk=run.durable_run_id) | Q(parent_id=run.durable_run_id)).values("pk")
    steps = StepCheckpoint.objects.filter(run_id__in=tree, status=StepCheckpoint.Status.PENDING).exclude(queue="")
    return {durable_settings().turn_queue, *steps.values_list("queue", flat=True).distinct()}


def activity(run: EvalRun) -> tuple:
    """Changes while anyone works on the run: its items, its and its items' rows, the leases of their turns."""
    from durable.models import DurableRun

    rows = DurableRun.objects.filter(Q(pk=run.durable_run_id) | Q(parent_id=run.durable_run_id)) \
        .aggregate(updated=Max("updated_at"), leased=Max("locked_until"))
    return run.status, run.items_done, rows["updated"], rows["leased"]


def follow(command: BaseCommand, run: EvalRun, *, workers: bool, timeout: float) -> EvalRun:
    """Follow the eval run and draw its progress: the Celery workers drive it when they serve the queues it
    needs (make run's do), else this process does. Gives up at `timeout`, when nobody can drive it, or once
    it has not moved for STALL_SECONDS (waiting for an approval, say)."""
    from durable.inprocess import drive_in_background

    if not workers and run_needs(run) <= serving_queues():
        workers = True
        command.stdout.write("Celery workers serve its queues: following the run they drive")
    driver = None if workers else drive_in_background(run.durable_run_id, max_wait=timeout)
    interactive = command.stdout.isatty() if hasattr(command.stdout, "isatty") else False
    now = time.monotonic()
    deadline, moved, asked, last, seen = now + timeout, now, now, None, None
    while True:
        run.refresh_from_db()
        line = f"{progress_bar(run.items_done, run.items_total)} {run.status}"
        if line != last:
            command.stdout.write(("\r" + line) if interactive else line, ending="" if interactive else "\n")
            last = line
        if run.status in EvalRun.TERMINAL:
            break
        now, current = time.monotonic(), activity(run)
        if current != seen:
            seen, moved = current, now
        if now > deadline:
            raise CommandError(f"eval run {run.pk} is still {run.status} after {timeout:g} s; follow it in the admin")
        if driver is not None and not driver.is_alive() and now - asked >= WORKERS_ASKED_EVERY:
            # this process ran out of work it can do: a worker took the run over, or nobody can go on with it
            asked, needs = now, run_needs(run)
            missing = needs - serving_queues()
            if missing and now - moved >= WORKERS_ASKED_EVERY:
                raise CommandError(f"eval run {run.pk} is still {run.status} and no Celery worker serves "
                                   f"{', '.join(sorted(missing))}; start the workers (make run) or follow it in "
                                   "the admin")
        if now - moved > STALL_SECONDS:
            raise CommandError(f"eval run {run.pk} is still {run.status} and has not moved for {STALL_SECONDS:g} s "
                               "(waiting for an approval or a timer?); follow it in the admin")
        time.sleep(0.2)
    if interactive:
        command.stdout.write("")
    return run


class Command(BaseCommand):
    help = "Run a golden set against a workflow version: a progress bar, the per-item results and a summary."

    def add_arguments(self, parser):
        parser.add_argument("golden_set", help="The golden set's id or name.")
        parser.add_argument("version", help="A version id or at least 6 characters of its hash.")
        parser.add_argument("--workspace", metavar="SLUG", help="The workspace, when several sets share the name.")
        parser.add_argument("--no-reuse", action="store_true", help="Run every item again (no earlier results).")
        parser.add_argument("--concurrency", type=int, default=None,
                            help=f"Items in flight at once, 1-{MAX_CONCURRENCY} (default EVAL_CONCURRENCY).")
        parser.add_argument("--workers", action="store_true",
                            help="Leave the run to the Celery workers and follow it (default: to the workers when "
                                 "they serve its queues, as make run's do, else run it here).")
        parser.add_argument("--timeout", type=float, default=1800, help="Seconds to follow the run (1800).")

    def handle(self, *args, golden_set, version, workspace=None, no_reuse=False, concurrency=None, workers=False,
               timeout=1800.0, **options):
        try:
            golden = golden_set_lookup(golden_set, workspace=workspace)
            target = version_lookup(version)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        try:
            run = eval_run_start(golden_set=golden, version=target, reuse=not no_reuse, concurrency=concurrency)
        except EvalError as exc:
            lines = [f"  {field}: {error}" for field, errors in exc.errors.items() for error in errors]
            raise CommandError("The eval run cannot start:\n" + "\n".join(lines)) from None
        self.stdout.write(f"eval run {run.pk}: {golden.name!r} x version {target.pk} ({target.dsl_hash[:12]}) "
                          f"of {target.workflow.name!r}")
        run = follow(self, run, workers=workers, timeout=timeout)
        if run.status != EvalRun.Status.COMPLETED:
            raise CommandError(f"eval run {run.pk} {run.status}: {run.error}")
        self.print_results(run)

    def print_results(self, run: EvalRun) -> None:
        rows = []
        for result in GoldenResult.objects.filter(eval_run=run).select_related("golden_item"):
            question = result.golden_item.input
            question = question.get("text", question) if isinstance(question, dict) else question
            score = "error" if result.score is None else display.score(result.score)
            rows.append([result.golden_item.position, str(question)[:48], score,
                         "pass" if result.passed else ("-" if result.passed is None else "fail"),
                         result.grader[:32], "reused" if result.reused_from_id else ""])
        self.stdout.write("")
        self.stdout.write(table(["#", "input", "score", "", "grader", ""], rows))
        self.stdout.write("")
        bins = score_histogram(run, bins=5)
        self.stdout.write("scores: " + "  ".join(f"{b['low']:.1f}-{b['high']:.1f}: {b['count']}" for b in bins))
        summary = [
            ["average score", display.score(run.avg_score)],
            ["pass rate", "-" if run.pass_rate is None else f"{display.percent(run.pass_rate)} (threshold "
                                                              f"{run.config.get('threshold')})"],
            ["fitness", "-" if run.fitness is None else f"{run.fitness:.2f} / 100"],
            ["items", f"{run.items_done} ({run.items_reused} reused, {run.grading_errors} grading errors)"],
            ["cost", f"{display.usd(run.usd_cost)} (paid now {display.usd(run.paid_usd)}, "
                     f"judge {display.usd(run.judge_usd)})"],
            ["latency p50 / p95", "-" if run.latency_p50_ms is None
             else f"{display.seconds(run.latency_p50_ms / 1000)} / {display.seconds(run.latency_p95_ms / 1000)}"],
        ]
        self.stdout.write(table(["", ""], summary))
        sys.stdout.flush()
