from django.apps import AppConfig


class WorkflowsConfig(AppConfig):
    name = "workflows"
    verbose_name = "Workflows"

    def ready(self):
        from durable import owners
        from workflows import execution
        from workflows.models import WorkflowInvocation

        owners.register(WorkflowInvocation, noun="invocation", plan=execution.invocation_plan,
                        on_end=execution.invocation_ended, related=("workflow_version",))
