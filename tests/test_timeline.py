"""`qw timeline`: the model is the fold's verdicts laid out; the SVG and the page are text.

Pure tests: records built by hand go through `build_model` (the real ClaimState), and the
drawings are checked as strings. The browser test is tests/test_timeline_browser.py.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest
from rich.console import Console

from queue_worker.ops import DEATH, KILL, PAUSE, RESTART, RESUME, OpRecord
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Renew
from supervisor.timeline.labels import text_width
from supervisor.timeline.model import DONE, HELD, LOST, STALE, TAKEN_OVER, build_model
from supervisor.timeline.page import render_page
from supervisor.timeline.svg import render_lanes
from supervisor.timeline.text import render_lanes as text_lanes
from supervisor.timeline.view import MAX_BARS, BoundError, parse_bound, parse_tasks, select

A = "w1-1001-aaaa"
B = "w2-1002-bbbb"
T0 = 1_700_000_000_000_000  # µs
LEASE = 1_000_000


def fenced_run() -> list[tuple[int, ClaimsRecord]]:
    """A pauses past its lease on task 0; B takes it over and finishes; A's DONE is stale.
    B also loses a claim on task 1 to A, who finishes it."""
    return [
        (10, Claim(0, A, T0, LEASE)),
        (20, Renew(0, A, T0 + 500_000, 10, LEASE)),  # lease now until T0 + 1.5 s
        (30, Claim(1, A, T0 + 600_000, LEASE)),
        (40, Claim(1, B, T0 + 700_000, LEASE)),  # lost: A holds task 1
        (50, Done(1, A, T0 + 900_000, 30)),
        (60, Claim(0, B, T0 + 2_000_000, LEASE)),  # takeover: A's lease lapsed at 1.5 s
        (70, Done(0, B, T0 + 2_500_000, 60)),
        (80, Done(0, A, T0 + 3_000_000, 10)),  # stale: claim @10 no longer holds task 0
    ]


def test_bars_arrows_and_marks_are_the_folds_verdicts() -> None:
    model = build_model(fenced_run(), [T0 - 100_000, T0 - 50_000])
    bars = {b.claim: b for b in model.bars}
    assert set(bars) == {10, 30, 60}
    victim = bars[10]
    assert victim.end_kind == TAKEN_OVER
    assert victim.end == victim.expiry == T0 + 1_500_000  # renewed once, then lapsed
    assert victim.renewals == (T0 + 500_000,)
    assert victim.late == T0 + 3_000_000  # its stale DONE
    assert bars[60].end_kind == DONE and bars[60].takeover
    assert bars[30].end_kind == DONE and not bars[30].takeover
    (arrow,) = model.arrows
    assert (arrow.task, arrow.from_claim, arrow.to_claim) == (0, 10, 60)
    assert (arrow.from_worker, arrow.to_worker) == (A, B)
    assert arrow.from_expiry == T0 + 1_500_000 and arrow.to_at == T0 + 2_000_000
    kinds = sorted((m.kind, m.position) for m in model.marks)
    assert kinds == [(LOST, 40), (STALE, 80)]
    assert [lane.label for lane in model.lanes] == ["w1·1001", "w2·1002"]
    assert model.done_at == (T0 + 900_000, T0 + 2_500_000)
    assert model.checks.summary == "total-queue check: VALID: 1 recovered"


def test_a_claim_still_held_at_the_end_is_open() -> None:
    model = build_model([(0, Claim(5, A, T0, LEASE))])
    (bar,) = model.bars
    assert bar.end_kind == HELD and bar.end_position is None and bar.expiry == T0 + LEASE


def test_ops_land_on_lanes_and_a_pause_is_a_window_until_its_resume() -> None:
    ops = [
        OpRecord(PAUSE, T0 + 100_000, "w1", A, 1001, 0, "demo", "SIGSTOP"),
        OpRecord(RESUME, T0 + 2_200_000, "w1", A, 1001, 0, "demo", "SIGCONT"),
        # the id unknown to the writer: matched to B's lane by the pid inside B's id
        OpRecord(KILL, T0 + 2_600_000, "w2", None, 1002, None, "operator", "kill SIGKILL"),
    ]
    model = build_model(fenced_run(), [], ops)
    pause, kill = model.ops
    assert (pause.kind, pause.lane, pause.at, pause.end) == (PAUSE, A, T0 + 100_000, T0 + 2_200_000)
    assert (kill.kind, kill.lane, kill.end) == (KILL, B, None)


def test_the_svg_has_a_lane_per_worker_an_arrow_per_takeover_and_titles() -> None:
    model = build_model(fenced_run())
    svg = render_lanes(select(model))
    assert svg.count('class="lane"') == 2
    assert 'id="lane-w1-1001-aaaa"' in svg and 'id="lane-w2-1002-bbbb"' in svg
    assert re.findall(r'<g class="takeover" id="takeover-(\d+)"', svg) == ["60"]
    assert "task 0: @10 → @60" in svg  # the fencing tokens on the arrow
    assert 'class="bar taken-over"' in svg and 'class="bar done"' in svg
    assert 'class="mark stale"' in svg and 'class="mark lost"' in svg
    assert "<title>DONE @80 · task 0 under claim @10" in svg
    assert "DONE @80 refused: token @10</text>" in svg  # the fencing, worded
    assert 'class="expiry"' in svg and 'class="late"' in svg and 'class="renew"' in svg


def test_text_from_the_log_is_escaped() -> None:
    hostile = 'w9-9-<script>"x"'
    svg = render_lanes(select(build_model([(0, Claim(0, hostile, T0, LEASE))])))
    assert "<script>" not in svg
    assert "&lt;script&gt;" in svg


def test_the_page_is_self_contained() -> None:
    page = render_page(select(build_model(fenced_run(), [T0, T0])), "/data/<dir>")
    assert "<script" not in page
    assert "&lt;dir&gt;" in page
    without_ns = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http" not in without_ns and "@import" not in page
    assert re.findall(r"url\((?!#)", page) == []
    assert "total-queue check: VALID: 1 recovered" in page
    # the facts agree in number with their counts
    assert "<b>1</b> takeover</li>" in page and "<b>2</b> worker processes</li>" in page
    assert "<b>2</b> tasks published</li>" in page
    for chart in ("chart-throughput", "chart-depth", "chart-claim-wait", "chart-takeover-delay"):
        assert f'id="{chart}"' in page


def big_run(tasks: int) -> list[tuple[int, ClaimsRecord]]:
    records: list[tuple[int, ClaimsRecord]] = []
    for t in range(tasks):
        worker = f"w{t % 8}-{100 + t % 8}-abcd"
        records.append((2 * t, Claim(t, worker, T0 + t * 1000, LEASE)))
        records.append((2 * t + 1, Done(t, worker, T0 + t * 1000 + 500, 2 * t)))
    return records


def test_a_large_run_is_narrowed_to_a_readable_default_and_says_so() -> None:
    model = build_model(big_run(10_000), [T0] * 10_000)
    view = select(model)
    assert len(view.bars) <= MAX_BARS
    assert view.notes and "10000 claims won" in view.notes[0]
    page = render_page(view, "big")
    assert len(page.encode()) < 1_000_000
    assert len(view.lanes) == 8


def test_tasks_and_a_window_narrow_the_view() -> None:
    model = build_model(fenced_run())
    only = select(model, parse_tasks("1"))
    assert {b.task for b in only.bars} == {1} and not only.arrows
    assert {m.kind for m in only.marks} == {LOST}
    late = select(model, None, parse_bound("+1.8s", model), parse_bound("@80", model))
    assert {b.claim for b in late.bars} == {10, 60}  # @10 lives on past its lease (late)
    assert [a.to_claim for a in late.arrows] == [60]


def test_bounds_and_task_lists_name_what_is_wrong() -> None:
    model = build_model(fenced_run())
    assert parse_tasks("3,5,10-12") == {3, 5, 10, 11, 12}
    assert parse_bound("@30", model) == T0 + 600_000
    assert parse_bound("+2", model) == T0 + 2_000_000
    for bad in ("x", "5-3", "-1"):
        with pytest.raises(BoundError, match="expected task ids"):
            parse_tasks(bad)
    with pytest.raises(BoundError, match="no record at or after"):
        parse_bound("@81", model)
    with pytest.raises(BoundError, match="expected a claims-log position"):
        parse_bound("soon", model)


def test_the_text_view_draws_every_lane_and_the_takeover() -> None:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(text_lanes(select(build_model(fenced_run())), width=90))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "w1·1001" in out and "w2·1002" in out
    assert "takeover of task 0: claim @10" in out and "CLAIM @60" in out
    assert "!" in out  # the stale DONE


def test_the_text_legend_names_every_character_the_lanes_draw() -> None:
    ops = [
        OpRecord(PAUSE, T0 + 100_000, "w1", A, 1001, 0, "demo", "SIGSTOP"),
        OpRecord(RESUME, T0 + 2_200_000, "w1", A, 1001, 0, "demo", "SIGCONT"),
        OpRecord(KILL, T0 + 2_600_000, "w2", None, 1002, None, "operator", "kill SIGKILL"),
    ]
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(text_lanes(select(build_model(fenced_run(), [], ops)), width=64))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    lanes = [line for line in out.splitlines() if line.startswith(("w1·", "w2·"))]
    drawn = {c for line in lanes for c in line.split(maxsplit=1)[1]} - {" "}
    legend = out.split("\n", len(lanes) + 1)[-1]
    assert "0-9 a claim starts (its task id's last digit)" in legend
    assert drawn & set("0123456789")  # the digits the legend explains are drawn
    for char in drawn - set("0123456789"):
        assert f"{char} " in legend, f"{char!r} is drawn but not in the legend"
    assert all(len(line) <= 80 for line in out.splitlines())


def lane_box(svg: str, worker: str) -> tuple[float, float]:
    """The top and height of `worker`'s lane in the lanes' SVG."""
    found = re.search(
        rf'id="lane-{worker}"[^>]*><rect class="lane-bg[^"]*" x="0" y="([\d.]+)" '
        rf'width="\d+" height="([\d.]+)"',
        svg,
    )
    assert found is not None
    return float(found[1]), float(found[2])


def test_a_pause_is_shaded_on_the_paused_workers_lane_only() -> None:
    ops = [
        OpRecord(PAUSE, T0 + 100_000, "w1", A, 1001, 0, "demo", "SIGSTOP"),
        OpRecord(RESUME, T0 + 2_200_000, "w1", A, 1001, 0, "demo", "SIGCONT"),
    ]
    svg = render_lanes(select(build_model(fenced_run(), [], ops)))
    (group,) = re.findall(r'<g class="op pause">.*?</g>', svg, re.S)
    rects = re.findall(r'<rect class="(\w+)" x="[\d.]+" y="([\d.]+)" width="[\d.]+" '
                       r'height="([\d.]+)"', group)  # fmt: skip
    assert {cls for cls, _, _ in rects} == {"band", "window"}
    top, tall = lane_box(svg, "w1-1001-aaaa")
    other_top, _ = lane_box(svg, "w2-1002-bbbb")
    assert other_top >= top + tall  # (the lanes do not overlap: B's is below A's)
    for _, y, height in rects:
        assert top <= float(y) and float(y) + float(height) <= top + tall


def crowded_run() -> tuple[list[tuple[int, ClaimsRecord]], list[OpRecord]]:
    """A is killed holding two tasks claimed 10 ms apart; B takes both over 10 ms apart:
    two takeover labels at one place, and a kill, a death and a restart at one moment."""
    records: list[tuple[int, ClaimsRecord]] = [
        (0, Claim(0, A, T0, LEASE)),
        (10, Claim(1, A, T0 + 10_000, LEASE)),
        (20, Claim(0, B, T0 + 1_100_000, LEASE)),
        (30, Claim(1, B, T0 + 1_110_000, LEASE)),
        (40, Done(0, B, T0 + 1_200_000, 20)),
        (50, Done(1, B, T0 + 1_300_000, 30)),
        (60, Done(0, A, T0 + 1_400_000, 0)),  # stale: A's token @0 is fenced off
    ]
    kill = T0 + 500_000
    ops = [
        OpRecord(KILL, kill, "w1", A, 1001, 0, "operator", "kill SIGKILL"),
        OpRecord(DEATH, kill, "w1", A, 1001, 0, "supervisor", "killed by SIGKILL"),
        OpRecord(RESTART, kill, "w1", A, 1001, None, "supervisor", ""),
    ]
    return records, ops


def label_spans(svg: str) -> list[tuple[float, float, float, str]]:
    """Each worded label of the plot: (y, left, right, text), its width estimated as the
    page lays it out (supervisor.timeline.labels)."""
    sizes = {"arrow-label": 11.0, "refused": 10.5, "": 10.0}
    spans = []
    label = re.compile(
        r'<text (?:class="(arrow-label|refused)" )?x="([\d.-]+)"( text-anchor="end")? '
        r'y="([\d.-]+)"[^>]*>([^<]+)</text>'
    )
    for m in label.finditer(svg):
        cls, x, end, y, text = m.groups()
        width = text_width(unescape(text), sizes[cls or ""])
        left = float(x) - width if end or cls == "refused" else float(x)
        spans.append((float(y), left, left + width, unescape(text)))
    return spans


def test_labels_on_a_lane_do_not_overlap() -> None:
    records, ops = crowded_run()
    svg = render_lanes(select(build_model(records, [], ops)))
    plot = svg[svg.index('<g class="plot"') :]
    spans = label_spans(plot)
    assert {"task 0: @0 → @20", "kill"} <= {text for *_, text in spans}  # worded, not dropped
    for i, (y, left, right, text) in enumerate(spans):
        for y2, left2, right2, text2 in spans[i + 1 :]:
            if abs(y - y2) < 10:  # on one line
                assert right <= left2 or right2 <= left, (text, text2)


def qw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_refuses_a_directory_without_logs_and_bad_options(tmp_path: Path) -> None:
    result = qw("timeline", "--dir", str(tmp_path / "none"))
    assert result.returncode == 2
    assert result.stderr.startswith("qw: error: no qw logs at")
    assert not (tmp_path / "none").exists()
    (tmp_path / "q").mkdir()
    assert qw("enqueue", "--dir", str(tmp_path / "q")).returncode == 0
    result = qw("timeline", "--dir", str(tmp_path / "q"), "--tasks", "abc")
    assert result.returncode == 2
    assert "--tasks: got 'abc'; expected task ids" in result.stderr
    result = qw("timeline", "--dir", str(tmp_path / "q"), "--to", "soon")
    assert result.returncode == 2
    assert result.stderr.startswith("qw: error: --to: got 'soon'; expected a claims-log position")
    result = qw("timeline", "--dir", str(tmp_path / "q"))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == tmp_path / "q" / "timeline.html"
    assert (tmp_path / "q" / "timeline.html").read_text().startswith("<!DOCTYPE html>")


def test_a_lease_that_lapsed_with_nobody_taking_over_is_a_lapse() -> None:
    records: list[tuple[int, ClaimsRecord]] = [
        (0, Claim(0, A, T0, LEASE)),
        (1, Renew(0, A, T0 + 1_400_000, 0, LEASE)),  # 0.4 s after the lease ran out: accepted
        (2, Done(0, A, T0 + 3_000_000, 0)),  # 0.6 s after the renewed lease ran out
    ]
    (bar,) = build_model(records).bars
    assert bar.end_kind == DONE
    assert bar.lapses == (
        (T0 + LEASE, T0 + 1_400_000),
        (T0 + 2_400_000, T0 + 3_000_000),
    )
    assert render_lanes(select(build_model(records))).count('class="lapse"') == 2
