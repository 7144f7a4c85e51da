"""The docs build as a site with mkdocs' strict mode (a broken link or a page missing from the nav fails),
and the product's pages speak of the product (no work-log labels)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOG = re.compile(r"\b(issue \d+|issue's|branch h\d|helper h\d|\(h\d\)|this session|other sessions|as built)\b",
                     re.I)


def test_the_docs_site_builds_strictly(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "index.html").exists()
    assert (tmp_path / "PERFORMANCE" / "index.html").exists()


def test_no_work_log_words_in_the_product_pages():
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{p.name}:{i + 1}: {line.strip()[:100]}" for p in pages
             for i, line in enumerate(p.read_text().splitlines()) if WORKLOG.search(line)]
    assert not found, "\n".join(found)
