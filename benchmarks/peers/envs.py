"""The variants of the head-to-head and where each runs: ours and the unbatched server in this interpreter, each
published peer in a virtual environment of its own under ``.cache/peers-server/<name>/``, from PyPI.

async-batcher 0.2.2 has this package's import name, so it can never share an interpreter with it; the others get
their own environments too, so that no peer sees another's packages. Every environment gets the server stack at
the versions this interpreter has (TensorFlow, Keras, numpy, FastAPI, uvicorn, uvloop, httptools, ...): the same
model code runs on the same libraries everywhere, and :func:`ensure` checks that the versions agree. The shared
wheels are downloaded once into ``.cache/peers-server/wheels/`` and installed from there.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["PEERS", "SHARED", "Peer", "ensure", "shared_pins"]

logger = logging.getLogger("async_batcher.bench.peers")

# The server stack every environment shares with this one, at this one's versions.
SHARED = (
    "tensorflow-cpu",
    "keras",
    "numpy",
    "h5py",
    "ml-dtypes",
    "fastapi",
    "starlette",
    "pydantic",
    "pydantic-core",
    "uvicorn",
    "uvloop",
    "httptools",
)


@dataclass(frozen=True)
class Peer:
    name: str  # the variant's name, and its environment's folder
    requirement: str  # what pip installs from PyPI, pinned
    distribution: str  # the distribution whose version the server reports


PEERS = (
    Peer("async-batcher-0.2.2", "async-batcher==0.2.2", "async-batcher"),
    Peer("batched", "batched==0.1.5", "batched"),
    Peer("fast-dynamic-batcher", "fast-dynamic-batcher==1.1.0", "fast-dynamic-batcher"),
)


def shared_pins() -> list[str]:
    """``name==version`` for the shared stack as installed here (the ones that are)."""
    pins = []
    for name in SHARED:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue  # e.g. tensorflow instead of tensorflow-cpu off x86-64: that one is listed instead
    if not any(p.startswith("tensorflow-cpu==") for p in pins):
        pins.append(f"tensorflow=={metadata.version('tensorflow')}")
    return pins


def _python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def versions_in(python: Path, names: list[str]) -> dict[str, str]:
    """The installed versions of ``names`` as ``python`` sees them (``-I``: nothing of this repository)."""
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\n"
        "for n in sys.argv[1:]:\n    try: out[n] = metadata.version(n)\n    except Exception: out[n] = None\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-I", "-c", code, *names], capture_output=True, text=True, check=True)
    found: dict[str, str] = json.loads(done.stdout)
    return found


def ensure(root: Path, peer: Peer) -> Path:
    """Create or reuse ``peer``'s environment and return its interpreter.

    Raises CalledProcessError when pip fails (no network) and RuntimeError when the versions do not agree.
    """
    env = root / peer.name
    pins = shared_pins()
    wanted = [peer.requirement, *pins]
    stamp = env / ".installed"
    if not (stamp.is_file() and stamp.read_text() == "\n".join(wanted) and _python(env).is_file()):
        wheels = root / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        # Once for all the environments: the shared wheels (TensorFlow is hundreds of MB).
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(wheels), *pins],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        if env.exists():
            shutil.rmtree(env)
        logger.info("creating %s with %s", env, " ".join(wanted))
        venv.create(env, with_pip=True, clear=True)
        _pip(_python(env), "--no-index", "--find-links", str(wheels), *pins)
        _pip(_python(env), "--no-deps", peer.requirement)
        stamp.write_text("\n".join(wanted))
    names = [pin.split("==")[0] for pin in wanted]
    found = versions_in(_python(env), names)
    expected = {pin.split("==")[0]: pin.split("==")[1] for pin in wanted}
    wrong = {n: (found.get(n), v) for n, v in expected.items() if found.get(n) != v}
    if wrong:
        raise RuntimeError(f"{peer.name}: versions differ from this environment's (found, expected): {wrong}")
    return _python(env)
