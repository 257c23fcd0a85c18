"""Staged progress (dpbench.data.stages): stage labels, dropped stages, the estimate for all stages left."""
import time

from dpbench.data import stages


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
