"""Check what ``make test`` needs from the machine, and say what to install for whatever is missing.

Python >= 3.11 (the library), Java >= 17 and Node.js with npm (DynamoDB Local, which tests/aws start, is a jar
installed from npm). Standard library only: it runs before the virtual environment exists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

MIN_PYTHON = (3, 11)
MIN_JAVA = 17


def java_major(java: str) -> int | None:
    """The major version ``java -version`` reports (``"17.0.15"`` -> 17, ``"1.8.0"`` -> 8), or None."""
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def problems() -> list[str]:
    found = []
    if sys.version_info < MIN_PYTHON:
        found.append(
            f"Python {'.'.join(map(str, MIN_PYTHON))}+ (this is {sys.version.split()[0]}):"
            " make test PYTHON=/path/to/python3.11"
        )
    java = shutil.which("java")
    major = java_major(java) if java else None
    if major is None or major < MIN_JAVA:
        have = "no java on PATH" if java is None else f"java {major or '?'} at {java}"
        found.append(
            f"Java {MIN_JAVA}+ ({have}), for DynamoDB Local: apt-get install -y openjdk-17-jre-headless"
            " (Debian/Ubuntu) or any JDK 17+"
        )
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            found.append(f"{tool}, to install DynamoDB Local from npm: apt-get install -y nodejs npm (Debian/Ubuntu)")
    return found


def main() -> int:
    missing = problems()
    for line in missing:
        print(f"make test needs {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
