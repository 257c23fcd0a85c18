"""Staged progress (dpbench.data.stages): stage labels, dropped stages, the estimate for all stages left."""
import re
import time

import pytest

from dpbench.data import stages
from dpbench.errors import UsageError


def test_outside_a_plan_nothing_changes():
    assert stages.label("pretrain") == "pretrain"
    stages.advance(10)  # no plan: nothing to count
    assert stages.eta() == ""


def test_stages_are_numbered_with_training_last_and_cached_ones_dropped(capsys):
    with stages.planned([("decode", 100, "decode"), ("pretrain", 10, "train"), ("features", 0, "forward"),
                         ("extract", 50, "forward")]) as plan:
        assert plan.count == 4  # the empty stage is not planned; private training is the last
        assert stages.label("decode") == "stage 1/4: decode"
        plan.drop("pretrain")  # found cached
        assert stages.label("extract") == "stage 2/3: extract"
    assert capsys.readouterr().err == "stage 3/3: private training\n"


def test_the_estimate_scales_the_units_left_by_the_measured_rate():
    with stages.planned([("a", 100, "forward"), ("b", 100, "train")]) as plan:
        assert plan.eta() == "all ≈ ?"
        stages.label("a")
        plan.started = time.perf_counter() - 10.0  # 50 forward passes in 10 s: 0.2 s a unit
        stages.advance(50)
        left = 50 * stages.COST["forward"] + 100 * stages.COST["train"]
        minutes, seconds = divmod(int(left * 0.2), 60)
        assert plan.eta() in (f"all ≈ {minutes}:{seconds:02d}", f"all ≈ {minutes}:{seconds - 1:02d}")
        stages.label("a")  # a second bar of the same stage (e.g. the test images) keeps its count
        assert plan.units_left() == left


def test_the_estimate_covers_the_private_training_that_follows():
    """Issue 35: just before the private training began, the estimate said all ≈ 0:00."""
    with stages.training_epochs(3):
        with stages.planned([("a", 100, "forward")], training_examples=1000) as plan:
            stages.label("a")
            plan.started = time.perf_counter() - 10.0  # 100 forward passes in 10 s: 0.1 s a unit
            stages.advance(100)
            assert plan.units_left() == 3 * 1000 * stages.COST["private"] == 390
            assert plan.eta() in ("all ≈ 0:39", "all ≈ 0:38")


def test_off_a_terminal_a_bar_is_a_line_at_a_steady_interval(capsys, monkeypatch):
    monkeypatch.setattr(stages, "on_terminal", lambda: False)
    monkeypatch.setenv("DPBENCH_PROGRESS_SECONDS", "0.05")
    with stages.bar(total=8, desc="stage 1/2: decode", unit="image") as bar:
        for _ in range(8):
            time.sleep(0.03)
            bar.update()
            bar.set_postfix_str("all ≈ 1:00")
    lines = capsys.readouterr().err.splitlines()
    assert 3 <= len(lines) <= 6 and "\r" not in "".join(lines)
    for line in lines[:-1]:
        assert re.fullmatch(r"stage 1/2: decode: [1-8]/8 image \(\d+%\), [\d.]+ image/s, 0:0\d elapsed, ETA 0:0\d, all ≈ 1:00", line)
    assert re.fullmatch(r"stage 1/2: decode: 8/8 image \(100%\), [\d.]+ image/s, done in 0:00, all ≈ 1:00", lines[-1])


def test_a_bad_progress_interval_is_refused(monkeypatch):
    monkeypatch.setattr(stages, "on_terminal", lambda: False)
    monkeypatch.setenv("DPBENCH_PROGRESS_SECONDS", "0")
    with pytest.raises(UsageError, match="DPBENCH_PROGRESS_SECONDS must be a number of seconds > 0, got '0'"):
        stages.bar(total=1)


def test_rates_are_printed_in_plain_digits():
    """A run above 1000 steps/s printed ``1.04e+03 step/s`` (format .3g), which the progress test's pattern (and a
    reader) does not expect; it failed whenever the machine was fast enough."""
    from dpbench.data.stages import _plain

    shown = [_plain(rate) for rate in (0, 1.234e-5, 0.0012345, 0.5, 12.345, 99.96, 999.6, 1040.3, 123456.7)]
    assert shown == ["0", "0.000012", "0.00123", "0.5", "12.3", "100", "1000", "1040", "123457"]
