from django.apps import AppConfig


class EvolutionConfig(AppConfig):
    name = "evolution"
    verbose_name = "Evolution"

    def ready(self):
        from durable import owners
        from evolution import execution
        from evolution.models import EvolutionRun

        owners.register(EvolutionRun, noun="evolution run", plan=execution.evolution_plan)
