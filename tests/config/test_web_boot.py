"""Review of 6164915: a web process loads the provider client and the price database as it boots
(config/wsgi.py). A web process makes no model call (the workers do), so what its boot loads is a warm-up:
each test boots one in a subprocess the way gunicorn's workers import config.wsgi."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def boot(code: str, **env: str | None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "LLM_PROVIDER": "openai", "OPENAI_API_KEY": "sk-test"}
    for name, value in env.items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("env", [
    # a SOCKS proxy for the machine's outbound traffic (the client library's transport needs socksio for it)
    {"ALL_PROXY": "socks5://127.0.0.1:1080"},
    # a CA bundle the model calls would read, missing on the web host
    {"SSL_CERT_FILE": "/nonexistent/review16-ca.pem"},
], ids=["socks-proxy", "missing-ca-bundle"])
def test_a_web_process_boots_whatever_its_environment_says_of_the_model_calls_it_never_makes(env):
    out = boot("import config.wsgi; print('booted')", **env)
    assert out.returncode == 0 and out.stdout.split() == ["booted"], out.stderr[-2000:]
    # and says why the model calls it would make fail
    assert "the provider client could not be built here, so model calls will fail: " in out.stderr


# ------------------------------------------------------------------------------------------ held

def test_a_web_process_connects_nowhere_as_it_boots():
    code = ("import json, socket\n"
            "seen = []\n"
            "real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex\n"
            "def connect(self, address): seen.append(repr(address)); return real_connect(self, address)\n"
            "def connect_ex(self, address): seen.append(repr(address)); return real_connect_ex(self, address)\n"
            "socket.socket.connect, socket.socket.connect_ex = connect, connect_ex\n"
            "import config.wsgi\n"
            "print(json.dumps(seen))\n")
    out = boot(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_an_offline_web_process_loads_no_provider_client_as_it_boots():
    out = boot("import sys, config.wsgi; print('openai' in sys.modules)", LLM_PROVIDER="offline",
               LLM_PROVIDERS=None, OPENAI_API_KEY=None, ALL_PROXY="socks5://127.0.0.1:1080")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
