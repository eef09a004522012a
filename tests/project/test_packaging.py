"""The distributions as PyPI and a user get them: built without warnings, licensed, complete, honest extras."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """The sdist and the wheel, built as ``python -m build`` builds them (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    # PYTHONDONTWRITEBYTECODE makes setuptools warn that it skips byte-compiling, whatever the project: not ours.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "log": done.stdout + done.stderr}


def test_the_build_warns_of_nothing(dist: dict[str, Path | str]) -> None:
    log = str(dist["log"])
    warnings = [line for line in log.splitlines() if "warn" in line.lower()]
    assert not warnings, "\n".join(warnings)


def test_twine_accepts_both(dist: dict[str, Path | str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(dist["sdist"]), str(dist["wheel"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _wheel_metadata(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(zf.read(meta_name).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return names, fields


def test_the_wheel_is_the_library_with_its_license(dist: dict[str, Path | str]) -> None:
    names, meta = _wheel_metadata(Path(dist["wheel"]))
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {n.split("/")[0] for n in names if not n.startswith("async_batcher-")} == {"async_batcher"}
    assert "async_batcher/py.typed" in names
    assert meta["License-Expression"] == ["Apache-2.0"]
    assert meta["Version"] == [importlib.metadata.version("async-batcher")]
    assert meta["Requires-Python"] == [">=3.11"]
    classifiers = meta["Classifier"]
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    assert {url.split(",")[0] for url in meta["Project-URL"]} >= {"Repository", "Issues", "Changelog"}
    assert meta["Author-email"] == ["Hussein Awala <hussein@awala.fr>"]


def test_no_extra_installs_a_framework_its_modules_do_not_import(dist: dict[str, Path | str]) -> None:
    _, meta = _wheel_metadata(Path(dist["wheel"]))
    extras = set(meta["Provides-Extra"])
    assert extras >= {"numpy", "keras", "fastapi", "metrics", "aws", "torch"}
    assert not extras & {"test", "bench", "tensorflow", "server"}  # development environments are groups
    by_extra: dict[str, set[str]] = {}
    for requirement in meta["Requires-Dist"]:
        name = re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].lower()
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)", requirement)
        by_extra.setdefault(extra.group(1) if extra else "", set()).add(name)
    frameworks = {"tensorflow", "tensorflow-cpu", "torch", "jax", "keras"}
    # async_batcher.ml.torch imports torch (its extra installs it); ml.keras calls the model it is given and
    # imports numpy only: no extra installs TensorFlow or Keras, which would replace the user's own build.
    assert {extra: names & frameworks for extra, names in by_extra.items() if names & frameworks} == {
        "torch": {"torch"}
    }
    assert "numpy" in by_extra["keras"] and "numpy" in by_extra["numpy"]


def test_the_sdist_holds_what_its_tests_need(dist: dict[str, Path | str]) -> None:
    with tarfile.open(dist["sdist"]) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    for needed in (
        "LICENSE",
        "CHANGELOG.md",
        "README.md",
        "Makefile",
        "mkdocs.yml",
        "docs/index.md",
        "docs/stylesheets/extra.css",
        "tests/conftest.py",
        "tests/batchers.py",
        "tests/servers.py",
        "examples/keras/app.py",
        "benchmarks/keras/server.py",
        "tools/check_prereqs.py",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.endswith((".pyc", ".html", ".log")) or "/raw/" in n]


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("async_batcher.ml.numpy", "numpy", "numpy"),
        ("async_batcher.ml.keras", "numpy", "keras"),
        ("async_batcher.fastapi", "starlette", "fastapi"),
        ("async_batcher.ml.fastapi", "starlette", "fastapi"),
        ("async_batcher.metrics", "prometheus_client", "metrics"),
        ("async_batcher.opentelemetry", "opentelemetry", "opentelemetry"),
    ],
)
def test_a_missing_extra_is_named(module: str, missing: str, extra: str) -> None:
    # None in sys.modules makes an import fail as if the package were not installed.
    code = f"import sys; sys.modules[{missing!r}] = None; import {module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"pip install 'async-batcher[{extra}]'" in done.stderr, done.stderr


def test_the_version_is_single_sourced() -> None:
    from async_batcher._version import __version__

    assert __version__ == importlib.metadata.version("async-batcher")
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()


def test_the_development_status_fits_the_version() -> None:
    # A development or pre-release (1.0.0.dev0) is not Production/Stable on its PyPI page; a final release is, and
    # this fails at the release until the classifier says so.
    from packaging.version import Version

    from async_batcher._version import __version__

    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    (status,) = [c for c in classifiers if c.startswith("Development Status ::")]
    if Version(__version__).is_prerelease:
        assert status in {"Development Status :: 3 - Alpha", "Development Status :: 4 - Beta"}, status
    else:
        assert status == "Development Status :: 5 - Production/Stable", status
