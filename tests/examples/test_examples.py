"""examples/: each runs from its own folder, as a user who copied that folder runs it, with what it lists next to it.

The examples run here with only the library importable besides their own folder (``PYTHONPATH`` holds just
``async_batcher``): an import of the repository's ``tools``, ``benchmarks`` or ``tests`` fails as it would for
the user.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from async_batcher import __version__

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FOLDERS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and any(p.glob("*.py")))
# Examples that serve the benchmark's model and run from a clone of the repository, as their docstrings say.
FROM_THE_REPOSITORY = {"ray_serve"}
REPOSITORY_PACKAGES = {"tools", "benchmarks", "tests", "examples", "docs"}
AWS = {
    "dynamodb": "write_items.py",
    "sqs": "send_messages.py",
    "sns": "publish_messages.py",
    "kinesis": "put_records.py",
}


def library_only(tmp_path: Path) -> dict[str, str]:
    """An environment in which the library is importable and nothing else of the repository."""
    (tmp_path / "async_batcher").symlink_to(ROOT / "async_batcher")
    return {**os.environ, "PYTHONPATH": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}


def test_every_example_is_covered() -> None:
    assert {p.name for p in FOLDERS} >= {*AWS, "keras", "streaming"}


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_an_example_lists_its_requirements_and_asks_for_this_version(folder: Path) -> None:
    lines = (folder / "requirements.txt").read_text().splitlines()
    requirements = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    (ours,) = [r for r in requirements if r.name == "async-batcher"]
    # This version (a dev release before 1.0 is out) and not 0.2.2, PyPI's only release, which has another API.
    assert ours.specifier.contains(Version(__version__), prereleases=True), ours
    assert not ours.specifier.contains(Version("0.2.2")), ours


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f.name not in FROM_THE_REPOSITORY], ids=lambda p: p.name)
def test_an_example_imports_nothing_of_the_repository(folder: Path) -> None:
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad = [name for name in names if name.split(".")[0] in REPOSITORY_PACKAGES]
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}: a user who copies the folder has none of it"


def test_the_aws_examples_run_from_their_folders(tmp_path: Path) -> None:
    # Against moto, which each starts itself (moto[server], in its requirements): every item is read back. The
    # four at once: most of their time is imports.
    env = library_only(tmp_path)
    runs = {
        folder: subprocess.Popen(
            [sys.executable, script, "--n", "20"],
            cwd=EXAMPLES / folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for folder, script in AWS.items()
    }
    for folder, run in runs.items():
        try:
            output, _ = run.communicate(timeout=180)
        finally:
            run.kill()
        assert run.returncode == 0, f"{folder}: {output}"
        assert "| batched | 20 |" in output and "| one call each | 20 |" in output, f"{folder}: {output}"


def test_the_streaming_app_imports_from_its_folder(tmp_path: Path) -> None:
    # As `uvicorn app:app` imports it there, its model.py beside it (tests/streaming serves the app itself).
    done = subprocess.run(
        [sys.executable, "-c", "import app; print(type(app.app).__name__)"],
        cwd=EXAMPLES / "streaming",
        env=library_only(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FastAPI"
