"""`make run`'s terminal: the 1 s tick logs at INFO only when it did something (finding: three INFO
lines a second). Records are emitted the way Celery emits them, on Celery's own loggers."""

import io
import json
import logging
import os
import subprocess
import sys
import time
from datetime import datetime
from urllib.parse import urlsplit, urlunsplit

import pytest
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS
from django.db import connection

import tests.durable.workflows  # noqa: F401 - registers the test workflows
from config.logging import JsonFormatter, LogContextFilter
from config.supervisor import BASE_DIR, stop_process_groups
from durable.inprocess import run_until_settled
from durable.models import DurableRun
from durable.services import run_start


def _emit(logger_name, msg, *args):
    logging.getLogger(logger_name).info(msg, *args)


def test_an_idle_tick_is_debug_and_a_busy_one_info(caplog):
    caplog.set_level(logging.INFO)
    idle = "{'recover_expired_leases': 0, 'resume_due_timers': 0, 'fire_due_schedules': 0}"
    busy = "{'recover_expired_leases': 0, 'resume_due_timers': 3, 'fire_due_schedules': 0}"
    failed = "{'resume_due_timers': 'error: OperationalError: gone'}"
    _emit("celery.beat", "Scheduler: Sending due task %s (%s)", "durable-tick", "durable.tick")
    _emit("celery.worker.strategy", LOG_RECEIVED, {"name": "durable.tick", "id": "1"})
    _emit("celery.app.trace", LOG_SUCCESS, {"name": "durable.tick", "id": "1", "runtime": 0.01,
                                            "return_value": idle})
    assert caplog.records == []
    _emit("celery.app.trace", LOG_SUCCESS, {"name": "durable.tick", "id": "2", "runtime": 0.01,
                                            "return_value": busy})
    _emit("celery.app.trace", LOG_SUCCESS, {"name": "durable.tick", "id": "3", "runtime": 0.01,
                                            "return_value": failed})
    assert [r.getMessage().split(" succeeded")[0] for r in caplog.records] == \
        ["Task durable.tick[2]", "Task durable.tick[3]"]


def test_other_tasks_still_log_at_info_and_debug_shows_the_tick(caplog):
    caplog.set_level(logging.DEBUG)
    _emit("celery.worker.strategy", LOG_RECEIVED, {"name": "durable.run_turn", "id": "9"})
    _emit("celery.worker.strategy", LOG_RECEIVED, {"name": "durable.tick", "id": "1"})
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "Task durable.run_turn[9] received"), ("DEBUG", "Task durable.tick[1] received")]


def test_the_http_clients_line_per_model_call_is_left_out_and_their_warnings_kept(caplog):
    """A worker making 64 calls a second wrote 64 INFO lines a second of `HTTP Request: POST ... 200 OK`."""
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpx2"):
        logging.getLogger(name).info('HTTP Request: POST http://127.0.0.1/v1/chat/completions "HTTP/1.1 200 OK"')
        logging.getLogger(name).warning("a warning of the client")
    assert [(r.name, r.levelname) for r in caplog.records] == [("httpx", "WARNING"), ("httpx2", "WARNING")]


# ------------------------------------------------------------------------------------ LOG_FORMAT=json

def _json_handler():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(LogContextFilter())
    return stream, handler


@pytest.mark.django_db
def test_json_lines_of_a_turn_and_its_step_carry_the_run_and_workspace(workspace, settings):
    settings.DURABLE_DISPATCH_ENABLED = False
    stream, handler = _json_handler()
    logger = logging.getLogger("tests.workflows")
    logger.addHandler(handler)
    try:
        run = run_start(workflow="tests.logging", input={"message": "hello"}, namespace=workspace.namespace)
        assert run_until_settled(run.id).status == "completed"
        logger.warning("after the run")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    turn, step, after = lines[0], next(line for line in lines if line["message"] == "step says hello"), lines[-1]
    assert turn["message"] == "turn says hello" and turn["level"] == "WARNING" and turn["logger"] == "tests.workflows"
    assert (turn["run_id"], turn["namespace"], turn["workspace"]) == (run.id, workspace.namespace, workspace.pk)
    assert step["run_id"] == run.id
    assert "run_id" not in after  # the context ends with the turn
    assert datetime.fromisoformat(turn["time"]).tzinfo is not None


@pytest.mark.django_db
def test_with_tracing_on_the_lines_of_a_turn_and_its_step_carry_the_runs_trace_id(workspace, settings):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from config import telemetry

    settings.DURABLE_DISPATCH_ENABLED = False
    stream, handler = _json_handler()
    logger = logging.getLogger("tests.workflows")
    logger.addHandler(handler)
    previous = telemetry.install(tracer_provider=telemetry.build_tracer_provider(span_exporter=InMemorySpanExporter()))
    try:
        run = run_start(workflow="tests.logging", input={"message": "hello"}, namespace=workspace.namespace)
        assert run_until_settled(run.id).status == "completed"
        logger.warning("after the run")
    finally:
        telemetry.restore(previous)
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    trace_id = DurableRun.objects.get(pk=run.id).trace_context.split("-")[1]
    turn, step = lines[0], next(line for line in lines if line["message"] == "step says hello")
    assert turn["trace_id"] == step["trace_id"] == trace_id
    assert "trace_id" not in lines[-1]  # outside the run's spans


def test_a_json_line_carries_the_exception():
    stream, handler = _json_handler()
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    handler.handle(record)
    line = json.loads(stream.getvalue())
    assert line["message"] == "failed here" and "ValueError: boom" in line["exception"]


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_with_log_format_json_writes_json_lines_naming_run_and_task(workspace, tmp_path, settings):
    settings.DURABLE_DISPATCH_ENABLED = True
    log_file = tmp_path / "worker.log"
    parts = urlsplit(os.environ["DATABASE_URL"])
    env = {**os.environ, "DATABASE_URL": urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"])),
           "DURABLE_WORKFLOW_MODULES": "tests.durable.workflows", "LOG_FORMAT": "json"}
    with log_file.open("w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "turns,steps", "-c", "1",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-n", "json-logs@%h",
             "--loglevel", "INFO"], cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
            start_new_session=True)
    try:
        run = run_start(workflow="tests.logging", input={"message": "from a worker"}, namespace=workspace.namespace)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and DurableRun.objects.get(pk=run.id).status != "completed":
            time.sleep(0.3)
        assert DurableRun.objects.get(pk=run.id).status == "completed"
    finally:
        stop_process_groups([worker], timeout=20)
    lines = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    turn = next(line for line in lines if line["message"] == "turn says from a worker")
    assert turn["run_id"] == run.id and turn["workspace"] == workspace.pk
    assert turn["task"] == "durable.run_turn" and turn["task_id"]
    step = next(line for line in lines if line["message"] == "step says from a worker")
    assert step["run_id"] == run.id and step["task"] == "durable.run_steps" and step["task_id"] != turn["task_id"]
