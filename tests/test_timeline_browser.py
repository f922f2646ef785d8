"""`qw timeline` in a real browser: a real run with a kill -9 (real workers, a real
takeover), its page rendered by headless Chromium.

Skipped only when chromium is missing outside CI; in CI (CI=true) its absence fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from queue_worker.ops import read_ops
from queue_worker.proof.report import load_report
from supervisor.timeline.svg import dom_id
from tests.browser import browse, chromium, external_references


# covered in make test by a page in headless Chromium: test_web_browser; the timeline's
# lanes: test_timeline
@pytest.mark.slow
def test_a_real_run_with_a_kill_renders_every_lane_and_takeover(tmp_path: Path) -> None:
    browser = chromium()
    run = tmp_path / "run"
    demo = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "demo", "redistribution", "--workers", "2",
         "--tasks", "3", "--lease", "0.5", "--work-ms", "800", "--dir", str(run)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"timeline: {run / 'timeline.html'}" in demo.stdout  # the demo names its page
    page = tmp_path / "page.html"
    made = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "timeline",
         "--dir", str(run), "--out", str(page)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == str(page)
    html = page.read_text(encoding="utf-8")
    assert external_references(html) == []
    assert "<script" not in html

    report = load_report(run)
    assert report.takeovers, "the kill -9 must have caused a takeover"
    ops, malformed = read_ops(run)
    assert malformed == 0 and [op.kind for op in ops] == ["kill"]

    dumped = browse(browser, page, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    assert "qw timeline" in dom
    for worker in report.workers:
        assert f'id="lane-{dom_id(worker.worker)}"' in dom, worker.worker
    for takeover in report.takeovers:
        assert f'id="takeover-{takeover.position}"' in dom
    assert dom.count('class="lane"') == len(report.workers)
    assert 'class="op kill"' in dom
    errors = [
        line
        for line in dumped.stderr.splitlines()
        if "CONSOLE" in line or "net::ERR" in line or "Failed to load" in line
    ]
    assert errors == []

    shot = tmp_path / "page.png"
    pictured = browse(browser, page, f"--screenshot={shot}", "--window-size=1400,900")
    assert pictured.returncode == 0, pictured.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
