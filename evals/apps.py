from django.apps import AppConfig


class EvalsConfig(AppConfig):
    name = "evals"
    verbose_name = "Evaluations"

    def ready(self):
        from durable import owners
        from evals import execution
        from evals.models import EvalRun

        owners.register(EvalRun, noun="eval run", plan=execution.eval_plan)
