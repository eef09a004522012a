"""Screenshot the built documentation site in headless Chromium, to look at it as a reader would.

    make docs && python tools/docs_screenshots.py [--site site] [--out .cache/docs-screenshots] [--page guides/sql/]

Serves ``site/`` on 127.0.0.1 (a free port, this process only), opens the landing page and the API reference
pages (or the pages named with ``--page``, as paths of the site) in Debian's ``chromium`` (apt-get install -y
chromium) with a fresh profile and no network of its own, writes one PNG per page and prints their paths. The
screenshots are for looking at; they are not committed. ``--size 1280,6000`` takes a long page whole.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = {"landing": "", "api-core": "reference/core/", "api-integrations": "reference/integrations/"}
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # one line a request is noise here
        pass


@contextlib.contextmanager
def serve(site: Path) -> Iterator[str]:
    """``site`` over HTTP on 127.0.0.1, for the duration of the block; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()
            thread.join()


def screenshot(chromium: str, url: str, path: Path, size: str) -> None:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        command = [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size}",
            f"--screenshot={path}",
            url,
        ]
        subprocess.run(command, check=True, capture_output=True, timeout=120)
    if not path.exists():
        raise RuntimeError(f"chromium wrote no screenshot of {url}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT / "site", help="the built site (make docs)")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "docs-screenshots")
    parser.add_argument("--size", default="1280,1000", help="window width,height in pixels")
    parser.add_argument(
        "--page", action="append", default=[], help="a page of the site to take instead (guides/sql/); repeatable"
    )
    args = parser.parse_args(argv)
    pages = {page.strip("/").replace("/", "-") or "landing": page for page in args.page} or PAGES
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        parser.error("no chromium on PATH: apt-get install -y chromium")
    if not (args.site / "index.html").exists():
        parser.error(f"no built site in {args.site}: make docs")
    args.out.mkdir(parents=True, exist_ok=True)
    with serve(args.site) as base:
        for name, page in pages.items():
            path = args.out / f"{name}.png"
            screenshot(chromium, base + page, path, args.size)
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
