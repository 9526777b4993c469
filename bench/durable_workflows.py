"""Workflows the durable benchmarks run. Workers import this module through
DURABLE_WORKFLOW_MODULES=bench.durable_workflows, so queued fan steps resolve here."""

from durable import Step, workflow


def trivial(index):
    """The step every benchmark runs: no work, so only the engine's cost is measured."""
    return index + 1


@workflow("bench.sequential")
def sequential(ctx, input):
    """`steps` inline steps, one after another (durable_steps)."""
    value = 0
    for index in range(input.get("steps", 100)):
        value = ctx.step(f"s{index}", trivial, index)
    return value


@workflow("bench.fan")
def fan(ctx, input):
    """One fan of `steps` queued steps run by Celery workers (durable_fan)."""
    results = ctx.all([Step(f"f{index}", trivial, (index,)) for index in range(input["steps"])])
    return len(results)
