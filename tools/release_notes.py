"""The notes of a release: its version's section of CHANGELOG.md, for the GitHub release of the tag.

``python -m tools.release_notes v1.0.0`` (``make release-notes RELEASE_TAG=v1.0.0``, which the release workflow
runs) prints the section ``## [1.0.0] ...`` of CHANGELOG.md without its heading. It fails, saying why, when the
tag is not ``v`` and the package's version (async_batcher/_version.py), or when CHANGELOG.md has no section for
that version: a release is cut from a changelog that says what it holds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["notes", "package_version"]

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/hussein-awala/async-batcher"


def package_version() -> str:
    """The version async_batcher/_version.py declares (read, not imported: no import of the package needed)."""
    text = (ROOT / "async_batcher" / "_version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if match is None:
        raise ValueError("async_batcher/_version.py declares no __version__")
    return match.group(1)


def notes(changelog: str, version: str) -> str:
    """The body of ``version``'s section of ``changelog`` (Keep a Changelog: ``## [VERSION] - DATE``)."""
    heading = re.compile(rf"^## \[{re.escape(version)}\][^\n]*\n", re.MULTILINE)
    match = heading.search(changelog)
    if match is None:
        raise ValueError(f"CHANGELOG.md has no section '## [{version}]': add it before tagging the release")
    end = re.compile(r"^## |^\[[^\]]+\]: ", re.MULTILINE).search(changelog, match.end())
    body = changelog[match.end() : end.start() if end else len(changelog)].strip()
    if not body:
        raise ValueError(f"CHANGELOG.md's section for {version} is empty")
    return body + "\n"


def absolute_links(text: str, tag: str) -> str:
    """Links to the repository's files made absolute, at ``tag``: a release's page resolves no relative link."""
    return re.sub(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)", rf"]({REPOSITORY}/blob/{tag}/\1)", text)


def main(tag: str) -> str:
    version = package_version()
    if tag != f"v{version}":
        raise ValueError(f"the tag {tag!r} is not v + the package's version, v{version}")
    return absolute_links(notes((ROOT / "CHANGELOG.md").read_text(), version), tag)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tools.release_notes vX.Y.Z")
    try:
        sys.stdout.write(main(sys.argv[1]))
    except ValueError as error:
        sys.exit(f"release notes: {error}")
