"""manage.py compare SET VERSION_A VERSION_B: the paired comparison of two versions on a golden set."""

from django.core.management.base import BaseCommand, CommandError

from config import display
from durable.management.commands.durable import table
from evals.selectors import golden_set_lookup
from evals.services import EvalError, compare_versions
from workflows.selectors import version_lookup


class Command(BaseCommand):
    help = ("Compare two versions on a golden set from their latest completed eval runs: per-item scores, the "
            "mean difference with its 95% interval, the Wilcoxon p-value and the verdict.")

    def add_arguments(self, parser):
        parser.add_argument("golden_set", help="The golden set's id or name.")
        parser.add_argument("version_a", help="The reference version (id or hash prefix).")
        parser.add_argument("version_b", help="The version compared with it.")
        parser.add_argument("--workspace", metavar="SLUG")
        parser.add_argument("--alpha", type=float, default=None, help="Significance level (default EVAL_ALPHA).")

    def handle(self, *args, golden_set, version_a, version_b, workspace=None, alpha=None, **options):
        try:
            golden = golden_set_lookup(golden_set, workspace=workspace)
            a, b = version_lookup(version_a), version_lookup(version_b)
            result = compare_versions(golden_set=golden, version_a=a, version_b=b, alpha=alpha)
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        except EvalError as exc:
            raise CommandError(str(exc)) from None
        critical = {row["item"] for row in result["critical_regressions"]}
        rows = []
        for position, row in enumerate(result["items"], 1):
            diff = "-" if row["a"] is None or row["b"] is None else f"{row['b'] - row['a']:+.2f}"
            flag = "critical regression" if row["item"] in critical else ("critical" if row["critical"] else "")
            rows.append([position, row["item"], _score(row["a"]), _score(row["b"]), diff, flag])
        self.stdout.write(table(["#", "item", f"a ({a.pk})", f"b ({b.pk})", "b - a", ""], rows))
        c = result["comparison"]
        self.stdout.write("")
        if c["mean_diff"] is None:
            self.stdout.write("not enough paired items to compare")
            return
        self.stdout.write(f"paired items: {c['n']}; mean a {display.score(c['mean_a'])}, "
                          f"mean b {display.score(c['mean_b'])}")
        self.stdout.write(f"mean difference b - a: {c['mean_diff']:+.3f} (95% interval {c['ci_low']:+.3f} to "
                          f"{c['ci_high']:+.3f})")
        self.stdout.write(f"Wilcoxon signed-rank p = {c['p_value']:.4g} (alpha {c['alpha']})")
        style = self.style.SUCCESS if c["verdict"] == "better" else (
            self.style.ERROR if c["verdict"] == "worse" else self.style.WARNING)
        self.stdout.write(style(f"verdict: b is {c['verdict']}" if c["verdict"] in ("better", "worse")
                                else f"verdict: {c['verdict']}"))
        if critical:
            self.stdout.write(self.style.ERROR(f"{len(critical)} critical item(s) regressed beyond "
                                               f"{result['critical_tolerance']}: a promotion would be refused"))


def _score(value) -> str:
    return "-" if value is None else f"{value:.2f}"
