"""manage.py evolve WORKFLOW --golden-set SET: evolve a workflow and watch it generation by generation."""

import time

from django.core.management.base import BaseCommand, CommandError

from config import display
from evals.selectors import golden_set_lookup
from evolution.models import EvolutionRun, Generation
from evolution.selectors import best_lineage
from evolution.services import EvolutionError, evolution_start
from workflows.models import Workflow


class Command(BaseCommand):
    help = ("Evolve a workflow against a golden set (genetic programming, reflective or iterative) and show each "
            "generation live: best / average fitness, evaluations, rollouts, cache hits, spend; then the held-out "
            "result (train / validation / test fitness of base and best, the test lift with its interval and "
            "paired test, the train-test gap, or why the set carries no held-out claim) and the lineage of the "
            "best version with the change each operation made.")

    def add_arguments(self, parser):
        parser.add_argument("workflow", help="The workflow's id or name.")
        parser.add_argument("--golden-set", required=True, metavar="SET", help="The golden set's id or name.")
        parser.add_argument("--workspace", metavar="SLUG", help="The workspace, when names are not unique.")
        parser.add_argument("--mode", choices=EvolutionRun.Mode.values, default=EvolutionRun.Mode.GP)
        parser.add_argument("--generations", type=int, default=None)
        parser.add_argument("--population", type=int, default=None)
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--budget", type=float, default=None, help="USD the run may spend (default 10).")
        parser.add_argument("--goal", default="", help="What the workflow should achieve (immigrants use it).")
        parser.add_argument("--workers", action="store_true",
                            help="Leave the run to the Celery workers and follow it (default: run it here).")
        parser.add_argument("--timeout", type=float, default=3600, help="Seconds to follow the run (3600).")

    def handle(self, *args, workflow, golden_set, workspace=None, mode="gp", generations=None, population=None,
               seed=None, budget=None, goal="", workers=False, timeout=3600.0, **options):
        target = self._workflow(workflow, workspace)
        try:
            golden = golden_set_lookup(golden_set, workspace=workspace or target.workspace.slug)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        config = {key: value for key, value in (("generations", generations), ("population", population),
                                                ("seed", seed), ("usd_budget", budget)) if value is not None}
        try:
            run = evolution_start(workflow=target, golden_set=golden, mode=mode, config=config, goal=goal)
        except EvolutionError as exc:
            lines = [f"  {field}: {error}" for field, errors in exc.errors.items() for error in errors]
            raise CommandError("The evolution cannot start:\n" + "\n".join(lines)) from None
        self.stdout.write(f"evolution {run.pk}: {target.name!r} on {golden.name!r}, mode {run.mode}, population "
                          f"{run.config['population']}, generations {run.config['generations']}, seed "
                          f"{run.config['seed']}; base version {run.base_version_id}")
        run = self._follow(run, workers=workers, timeout=timeout)
        if run.status != EvolutionRun.Status.COMPLETED:
            raise CommandError(f"evolution {run.pk} {run.status}: {run.error or run.stop_reason}")
        self._summary(run)

    def _workflow(self, ref: str, workspace: str | None) -> Workflow:
        workflows = Workflow.objects.select_related("workspace")
        if workspace:
            workflows = workflows.filter(workspace__slug=workspace)
        found = workflows.filter(pk=int(ref)).first() if ref.isascii() and ref.isdigit() else None
        if found is None:
            matches = list(workflows.filter(name=ref)[:2])
            if len(matches) > 1:
                raise CommandError(f"several workflows are named {ref!r}: add --workspace SLUG")
            found = matches[0] if matches else None
        if found is None:
            raise CommandError(f"no workflow {ref!r}")
        return found

    def _follow(self, run: EvolutionRun, *, workers: bool, timeout: float) -> EvolutionRun:
        from durable.inprocess import drive_in_background

        driver = None if workers else drive_in_background(run.durable_run_id, max_wait=timeout)
        shown, deadline = -1, time.monotonic() + timeout
        while True:
            run.refresh_from_db()
            for generation in Generation.objects.filter(evolution_run=run, number__gt=shown).order_by("number"):
                self._generation_line(generation)
                shown = generation.number
            if run.status in EvolutionRun.TERMINAL:
                return run
            if run.status == EvolutionRun.Status.PAUSED and run.paused_at:
                self.stdout.write(self.style.WARNING(f"paused at {run.paused_at}: resume it from the admin or the API"))
                return run
            if time.monotonic() > deadline or (driver is not None and not driver.is_alive()):
                run.refresh_from_db()
                if run.status in EvolutionRun.TERMINAL:
                    continue
                raise CommandError(f"evolution {run.pk} is still {run.status}; start the workers (make run) "
                                   "or follow it in the admin")
            time.sleep(0.3)

    def _report(self, report: dict) -> None:
        """The generalization result: base and best on each split, the test lift with its interval and paired
        test, the train-test gap; or why the run makes no held-out claim."""
        if not report.get("held_out"):
            self.stdout.write(self.style.WARNING(
                "no held-out claim: searched and selected on the whole set, so the lift above is on the items it "
                f"optimized. {report.get('reason', '')}".rstrip()))
            return

        def cell(value):
            return "     -" if value is None else f"{value:6.2f}"

        self.stdout.write("held-out result (fitness):     train  validation    test")
        for role in ("base", "best"):
            side = report.get(role) or {}
            self.stdout.write(f"  {role} version {side.get('version_id')!s:<12} {cell(side.get('train'))}      "
                              f"{cell(side.get('validation'))}  {cell(side.get('test'))}")
        test = report.get("test")
        if not test:
            self.stdout.write(self.style.WARNING(report.get("test_error") or "the test split was not scored"))
            return
        c = test.get("comparison") or {}

        def pct(value):
            return "-" if value is None else f"{value:+.1%}"

        self.stdout.write(self.style.SUCCESS(
            f"lift on test: {pct(test.get('lift'))} (95% interval {pct(test.get('lift_low'))} to "
            f"{pct(test.get('lift_high'))}); paired test on {test.get('paired')} test items: {c.get('verdict')}, "
            f"Wilcoxon p = {c.get('p_value')}"))
        gap = report.get("train_test_gap")
        self.stdout.write("train-test gap of the best: " + ("-" if gap is None else f"{gap:+.2f} fitness points"))
        if report.get("test_error"):
            self.stdout.write(self.style.WARNING(report["test_error"]))

    def _generation_line(self, generation: Generation) -> None:
        s = generation.stats
        improvement = s.get("improvement")
        self.stdout.write(
            f"  generation {generation.number}: best {s.get('best', 0):6.2f}  avg {s.get('avg', 0):6.2f}  "
            f"worst {s.get('worst', 0):6.2f}  | run best {s.get('run_best_fitness', 0):6.2f}"
            + (f", validation {s['run_best_validation_fitness']:6.2f}"
               if s.get("run_best_validation_fitness") is not None else "")
            + (f" ({improvement:+.2f})" if improvement else "")
            + f"  | evaluations {s.get('run_evaluations', 0)}, rollouts {s.get('run_rollouts', 0)}, "
              f"cache hits {s.get('run_cache_hits', 0)}, spent {display.usd(s.get('run_usd', 0))}")

    def _summary(self, run: EvolutionRun) -> None:
        self.stdout.write("")
        lift = run.lift
        searched = "train" if run.held_out else "whole set"
        self.stdout.write(self.style.SUCCESS(
            f"stopped: {run.stop_reason}. Best version {run.best_version_id}: fitness {run.best_fitness:.2f} on the "
            f"{searched} (base {run.base_fitness:.2f}" + (f", {lift:+.1%}" if lift is not None else "") + ")"))
        self.stdout.write(f"{run.evaluations} evaluations, {run.rollouts} item rollouts, {run.cache_hits} cache hits, "
                          f"{display.usd(run.usd_cost)}")
        self._report(run.report or {})
        steps = best_lineage(run)
        if len(steps) > 1:
            self.stdout.write("lineage of the best version:")
            for step in steps:
                change = "" if step["change"] is None else f" ({step['change']:+.2f})"
                fitness = "-" if step["fitness"] is None else f"{step['fitness']:.2f}"
                merge = f" x {step['parent2_id']}" if step["parent2_id"] else ""
                self.stdout.write(f"  {step['version_id']}{merge}  {step['operation']:<9} {fitness}{change}  "
                                  f"{step['note'][:100]}")
