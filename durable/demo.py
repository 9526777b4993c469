"""Demo seed for the durable engine: one digest run and a schedule that starts one every 10 minutes, in the
demo workspace's namespace (so its members, the admin login included, reach them through the API)."""

from durable.models import DurableRun, Schedule
from durable.services import run_start, schedule_save
from workspaces.demo import demo_workspace

RUN_ID = "demo-digest"
SCHEDULE_KEY = "demo-digest-every-10-minutes"


def seed(stdout) -> None:
    namespace = demo_workspace().namespace
    # an installation seeded before the demo had a workspace keeps its demo rows, moved into it
    DurableRun.objects.filter(pk=RUN_ID, namespace="default").update(namespace=namespace)
    if not Schedule.objects.filter(namespace=namespace, key=SCHEDULE_KEY).exists():
        Schedule.objects.filter(namespace="default", key=SCHEDULE_KEY).update(namespace=namespace)
    if not DurableRun.objects.filter(pk=RUN_ID).exists():
        run_start(workflow="durable.demo.digest", run_id=RUN_ID, namespace=namespace, tags=["demo"],
                  input={"texts": ["a crash loses nothing", "timers survive restarts", "fans settle in bulk"]})
        stdout.write(f"durable: started the demo run {RUN_ID}")
    if not Schedule.objects.filter(namespace=namespace, key=SCHEDULE_KEY).exists():
        schedule_save(key=SCHEDULE_KEY, workflow="durable.demo.digest", namespace=namespace, every_seconds=600,
                      overlap="skip", input={"pause_seconds": 1}, tags=["demo"])
        stdout.write("durable: scheduled durable.demo.digest every 10 minutes")
