"""Seed the 7 canonical agents (workflows, base versions, golden sets) into a workspace (idempotent)."""

from django.core.management.base import BaseCommand, CommandError

from evals.agents import AgentFileError, seed_agents
from evals.services import EvalError
from workflows.dsl import DslError
from workspaces.models import Workspace


class Command(BaseCommand):
    help = ("Seed the canonical agents of evals/agents/ into a workspace: each a workflow with its base version "
            "(activated unless an operator chose another active version) and its golden set. Unchanged agents "
            "are skipped; golden items are updated in place by their key.")

    def add_arguments(self, parser):
        parser.add_argument("--workspace", metavar="SLUG",
                            help="The workspace to seed (default: the demo workspace, created when missing).")
        parser.add_argument("--prune", action="store_true",
                            help="Delete seeded golden items (and their results) whose key is no longer in the files.")

    def handle(self, *args, workspace=None, prune=False, **options):
        if workspace:
            target = Workspace.objects.filter(slug=workspace).first()
            if target is None:
                raise CommandError(f"No workspace with the slug {workspace!r}.")
        else:
            from workspaces.demo import demo_workspace

            target = demo_workspace()
        try:
            report = seed_agents(workspace=target, prune=prune)
        except (AgentFileError, DslError, EvalError) as exc:
            raise CommandError(f"cannot seed the agents: {exc}") from None
        self.stdout.write(self.style.MIGRATE_HEADING(f"{target.slug}:"))
        for outcome in report.agents:
            self.stdout.write(f"  {outcome.line()}")
        if report.missing_skills:
            self.stderr.write(self.style.WARNING(
                f"  skills the agents name that {target.slug!r} has no active version of: "
                f"{', '.join(report.missing_skills)} (run `manage.py seed_skills --workspace {target.slug}`)"))
        changed = sum(outcome.changed for outcome in report.agents)
        self.stdout.write(f"  {len(report.agents)} agents, {changed} changed")
