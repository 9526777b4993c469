"""Demo seed for the durable engine: one digest run and a schedule that starts one every 10 minutes."""

from durable.models import DurableRun, Schedule
from durable.services import run_start, schedule_save


def seed(stdout) -> None:
    if not DurableRun.objects.filter(pk="demo-digest").exists():
        run_start(workflow="durable.demo.digest", run_id="demo-digest", tags=["demo"],
                  input={"texts": ["a crash loses nothing", "timers survive restarts", "fans settle in bulk"]})
        stdout.write("durable: started the demo run demo-digest")
    if not Schedule.objects.filter(key="demo-digest-every-10-minutes").exists():
        schedule_save(key="demo-digest-every-10-minutes", workflow="durable.demo.digest", every_seconds=600,
                      overlap="skip", input={"pause_seconds": 1}, tags=["demo"])
        stdout.write("durable: scheduled durable.demo.digest every 10 minutes")
