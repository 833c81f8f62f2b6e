"""As a new user: `pip install ./clients/python` in a fresh virtualenv, then the README's example as printed."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_readme_example_runs_in_a_fresh_virtualenv(stack, tmp_path):
    venv = tmp_path / "venv"
    # This machine reaches no Python package index, so the build backend (setuptools and
    # wheel, which `pip install ./clients/python` fetches elsewhere) comes from Debian's
    # packages through --system-site-packages. The client itself needs no other package.
    # pip too: run by the venv's python it installs into the venv (copying a pip of its own
    # in, ensurepip, took most of this test's time).
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Built from a copy: setuptools writes its metadata beside the sources, not in the checkout then.
    source = tmp_path / "src"
    shutil.copytree(REPO / "clients" / "python", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", str(source)], check=True, cwd=tmp_path)
    readme = (REPO / "README.md").read_text()
    example = re.search(r"<!-- python-example[^>]*-->\n```python\n(.*?)```", readme, re.S).group(1)
    env = {**os.environ, "ROLLBOX_URL": stack["url"], "ROLLBOX_TOKEN": stack["tokens"]["user"], "PYTHONPATH": ""}
    out = subprocess.run([str(python), "-c", example], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "0 solved\nstep 1\nstep 2\nstep 3\n42\n"
    # The installed package, not the checkout, ran it.
    where = subprocess.run([str(python), "-c", "import rollbox; print(rollbox.__file__)"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert str(venv) in where.stdout
