"""Boundary hits (dpbench/board/boundary.py): a selection on an end of its search list or in the outer 5% of its
range is a hit, one list step (or a little more than 5%) inside is not; ``--check`` lists a method whose selections of
a task and track hit a boundary (or the budget's top) more often than chance; the rate per method counts the
studies and sets them beside their chance."""
import json
import math

import pytest

from dpbench.board import boundary
from dpbench.board.model import build_tables
from dpbench.cli import main
from dpbench.results import store
from tests.test_board_check import board
from tests.test_leaderboard import add_run

EPOCHS = {"type": "categorical", "choices": [10, 3, 5]}  # unordered as given: the order is the numbers'
LR = {"type": "float", "low": 0.01, "high": 100.0, "log": True}
CLIP = {"type": "float", "low": 0.0, "high": 10.0}


def log_point(share: float) -> float:
    """The value ``share`` of the way from LR's low to its high, on its log scale."""
    return math.exp(math.log(0.01) + share * (math.log(100.0) - math.log(0.01)))


@pytest.mark.parametrize("entry, value, end", [
    (EPOCHS, 10, "high"),
    (EPOCHS, 5, None),  # one list step inside the top
    (EPOCHS, 3, "low"),
    ({"type": "categorical", "choices": [0.0, 0.9]}, 0.9, None),  # two numbers: a switch, no inside
    ({"type": "categorical", "choices": [64, 256, 1024]}, 64, "low"),
    ({"type": "categorical", "choices": ["convex", "strongly_convex"]}, "convex", None),  # names are not ordered
    ({"type": "categorical", "choices": [None, 1.0, 2.0]}, 2.0, None),  # not every choice a number
    ({"type": "categorical", "choices": [True, False]}, True, None),  # booleans are not numbers here
    ({"type": "categorical", "choices": [8]}, 8, None),  # nothing chosen
    (LR, log_point(0.04), "low"),
    (LR, log_point(0.06), None),  # a little more than 5% inside, on the log scale
    (LR, log_point(0.94), None),
    (LR, log_point(0.96), "high"),
    (LR, 0.3, None),  # 0.3 is under 5% of [0.01, 100] linearly, not on its log scale
    (CLIP, 0.4, "low"),  # a linear range: 4% of [0, 10]
    (CLIP, 0.6, None),
    (CLIP, 9.6, "high"),
    ({"type": "int", "low": 1, "high": 101}, 100, "high"),
    ({"type": "int", "low": 1, "high": 101}, 90, None),
])
def test_a_selection_is_a_hit_exactly_on_a_boundary(entry, value, end):
    assert boundary.boundary(entry, value) == end


def test_hits_name_the_hyperparameters_and_their_ends():
    space = {"epochs": EPOCHS, "lr": LR, "variant": {"type": "categorical", "choices": ["a", "b"]}}
    assert boundary.hits(space, {"epochs": 10, "lr": log_point(0.02), "variant": "b"}) == {"epochs": "high",
                                                                                           "lr": "low"}
    assert boundary.hits(space, {"epochs": 5, "lr": log_point(0.5), "variant": "a"}) == {}


def validation_tuning(epochs, lr=1.0, space=None):
    return {"mode": "validation", "selected_params": {"epochs": epochs, "lr": lr},
            "config": {"mode": "validation", "search_space": space or {"epochs": EPOCHS, "lr": LR}}}


def study_tuning(seed, lr):
    """A random-stopping study's released record: its own study name, the space beside its config's."""
    return {"mode": "random-stopping", "study": f"study-{seed}", "selected_params": {"lr": lr},
            "search_space": {"lr": LR}, "config": {"mode": "random-stopping", "search_space": {"lr": LR}}}


LONG_EPOCHS = {"type": "categorical", "choices": [3, 5, 10, 20, 40, 80]}


def tuned_board(epochs_at_8=5, studies_high=0, epochs=None, space=None, high_everywhere=False):
    """The clean board of test_board_check, plus a validation-tuned dpsgd row (epochs 5 everywhere but at ε = 8:
    ``epochs_at_8``; ``epochs`` everywhere if given, from ``space``) and a random-stopping dpsgd row
    (``studies_high`` of the 5 studies at ε = 8, or at every ε, choose an lr at the top of its range; the others the
    middle), every cell clean otherwise."""
    board()
    means = {1: 0.80, 2: 0.82, 8: 0.84}
    for seed, offset in enumerate([-0.007, -0.0035, 0.0, 0.0035, 0.007]):
        for epsilon, mean in means.items():
            chosen = epochs or (epochs_at_8 if epsilon == 8 else 5)
            add_run(mean + offset, seed=seed, epsilon_target=epsilon, epsilon=epsilon, test_majority_rate=0.6,
                    tuning=validation_tuning(chosen, space=space), hyperparameters={"lr": 1.0, "epochs": chosen})
            lr = 99.0 if (epsilon == 8 or high_everywhere) and seed < studies_high else 1.0
            add_run(mean + offset, seed=seed, epsilon_target=epsilon, epsilon=epsilon, test_majority_rate=0.6,
                    tuning=study_tuning(seed, lr), hyperparameters={"lr": lr, "epochs": 3})


def check(capsys, *args):
    code = main(["leaderboard", "--check", *args])
    return code, capsys.readouterr().out.splitlines()


def test_a_selection_one_step_inside_its_list_passes_the_check(capsys):
    tuned_board(epochs_at_8=5)
    assert check(capsys) == (0, [])


@pytest.mark.parametrize("epochs_at_8", [10, 3])
def test_one_selection_at_an_end_is_chance_not_a_violation(capsys, epochs_at_8):
    """One of three selections on an end, where 70% of uniform draws are (epochs' two ends of three, lr's outer
    10%): listed per cell until 26 November 2026, though a board whose lists do not bind has such cells by chance."""
    tuned_board(epochs_at_8=epochs_at_8)
    assert check(capsys) == (0, [])


def test_selections_pressing_against_the_budget_are_listed_until_explained(capsys, tmp_path):
    """Every validation selection at 80 epochs, the top of six choices: (1/6)³ by chance."""
    tuned_board(epochs=80, space={"epochs": LONG_EPOCHS, "lr": LR})
    code, lines = check(capsys)
    p = (1 / 6) ** 3
    # three tests in Holm's family: the random-stopping row's space (lr alone) has no budget to hit
    assert (code, lines) == (1, [f"boundary-hit: digits (add-remove) · validation · dpsgd · every ε: 3 of 3 "
                                 f"selections at the top of the compute budget, 0.5 expected by chance (P = {p:.2g}, "
                                 f"Holm-adjusted {3 * p:.2g}): epochs high at ε = 1, 2, 8"])
    exceptions = tmp_path / "exceptions.json"
    exceptions.write_text(json.dumps([{"kind": "boundary-hit", "task": "digits", "method": "dpsgd",
                                       "track": "validation", "epsilons": "all", "reason": "a test of the check",
                                       "tested_by": "pytest"}]))
    assert check(capsys, "--exceptions", str(exceptions)) == (0, [])


def test_random_stopping_studies_at_an_edge_more_often_than_chance_are_listed(capsys):
    tuned_board(studies_high=1, high_everywhere=True)  # 3 of 15 studies in lr's outer 10%: chance
    assert check(capsys) == (0, [])
    store.default_path().unlink()
    tuned_board(studies_high=2, high_everywhere=True)  # 6 of 15
    code, lines = check(capsys)
    p = boundary.upper_tail(6, [0.1] * 15)
    assert (code, lines) == (1, [f"boundary-hit: digits (add-remove) · random-stopping · dpsgd · every ε: 6 of 15 "
                                 f"selections on a boundary, 1.5 expected by chance (P = {p:.2g}, Holm-adjusted "
                                 f"{3 * p:.2g}): lr high at ε = 1, 2, 8"])


def test_the_rate_counts_the_studies_hitting_per_cell():
    tuned_board(epochs_at_8=10, studies_high=2)
    tables = build_tables(store.load())
    found = {(rate.track, rate.method): rate for rate in boundary.rates(tables)}
    validation, stopping = found["validation", "dpsgd"], found["random-stopping", "dpsgd"]
    assert (validation.cells, validation.studies) == (3, 3)
    assert validation.rate == pytest.approx(1 / 3)  # one of three cells, each one selection
    assert (stopping.cells, stopping.studies) == (3, 15)
    assert stopping.rate == pytest.approx((2 / 5) / 3)  # 2 of 5 studies in one of three cells
    assert dict(stopping.by_end) == {("lr", "high"): 2}
    overall = found["all tuned", "all"]
    assert (overall.cells, overall.studies) == (6, 18)  # the non-private cell recorded no selection: not counted
    assert overall.rate == pytest.approx((1 + 2 / 5) / 6)
    assert ("none", "dpsgd") not in found  # untuned rows have no selection


def test_the_rates_are_printed_for_the_readme(capsys):
    tuned_board(epochs_at_8=10)
    assert main(["leaderboard", "--boundary-hits"]) == 0
    out = capsys.readouterr().out
    assert "| validation | dpsgd | 3 | 3 | 33.3% | 70.0% | " in out and out.count("| epochs high 1 |") == 3
    assert "| all tuned | all | 6 | 18 | 16.7% | 40.0% | " in out


@pytest.mark.parametrize("space, expected", [
    ({"epochs": EPOCHS}, 2 / 3),
    ({"lr": LR}, 2 * boundary.EDGE),
    ({"momentum": {"type": "categorical", "choices": [0.0, 0.9]}}, 0.0),  # a switch has no boundary
    ({"n": {"type": "int", "low": 1, "high": 101}}, 12 / 101),  # 1..6 and 96..101
    ({"epochs": EPOCHS, "lr": LR, "clip": CLIP}, 1 - (1 / 3) * 0.9 * 0.9),
])
def test_the_chance_of_a_hit_is_the_share_of_a_uniform_draw_on_a_boundary(space, expected):
    assert boundary.chance(space) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("method", ["dpsgd", "dpgd", "amp", "output_perturbation", "nonprivate", "adaclip"])
def test_the_chance_is_the_rate_of_the_searchs_own_draws(method):
    """An independent check of :func:`boundary.chance` against the draws the tracks make (the validation track's
    Sobol points, the random-stopping track's Optuna random draws), on the method's search space on adult."""
    from dpbench import registry
    from dpbench.tuning import search, validation

    space = validation.search_space(registry.methods()[method], registry.tasks()["adult"])
    expected = boundary.chance(space)
    for drawn in (search.spread_draws(space, 4096, 0, "validation-search"),
                  search.draws(space, 4096, 0, "validation-search")):
        observed = sum(bool(boundary.hits(space, params)) for params in drawn) / len(drawn)
        assert observed == pytest.approx(expected, abs=4 * math.sqrt(expected * (1 - expected) / 4096) + 1e-3)


def test_the_upper_tail_is_the_binomials_where_the_chances_are_equal_and_exact_where_not():
    from scipy import stats

    for n, p, k in [(10, 0.3, 0), (10, 0.3, 4), (64, 0.65, 41), (5, 0.9, 5)]:
        assert boundary.upper_tail(k, [p] * n) == pytest.approx(stats.binom.sf(k - 1, n, p), rel=1e-9)
    # unequal chances, by enumeration of the 2³ outcomes
    chances = [0.1, 0.5, 0.8]
    exact = sum(math.prod(p if bit else 1 - p for p, bit in zip(chances, bits))
                for bits in __import__("itertools").product([0, 1], repeat=3) if sum(bits) >= 2)
    assert boundary.upper_tail(2, chances) == pytest.approx(exact, rel=1e-12)


def test_the_rates_table_sets_each_rate_beside_its_chance(capsys):
    tuned_board(epochs_at_8=10)  # validation: one of 3 cells at the top of epochs [3, 5, 10]
    assert main(["leaderboard", "--boundary-hits"]) == 0
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): [c.strip() for c in line.split("|")[1:-1]]
            for line in capsys.readouterr().out.splitlines()[2:]}
    validation = rows["validation", "dpsgd"]
    # each validation study: chance 1 − (1/3)(0.9) = 0.7 (epochs' two ends of three, lr's outer 10%)
    assert validation[4:7] == ["33.3%", "70.0%", f"{boundary.upper_tail(1, [0.7] * 3):.2g}"]
    assert validation[7:10] == ["1 (33%)", "33%", f"{boundary.upper_tail(1, [1 / 3] * 3):.2g}"]


def test_a_budget_that_binds_on_every_task_is_listed_though_no_task_alone_shows_it(capsys):
    """Two of three selections at the top of six epochs on each of four tasks: P = 0.074 per task, nothing after
    Holm, so a budget that binds everywhere went unlisted (27 November: the rebuild's validation track chose the top
    epochs in 117 of 436 cells, 18% by chance, and --check listed none); pooled over the tasks it is listed."""
    space = {"epochs": LONG_EPOCHS, "lr": LR}
    for task in ("digits", "adult", "covertype", "kddcup99"):
        for seed, offset in enumerate([-0.007, -0.0035, 0.0, 0.0035, 0.007]):
            for epsilon, mean in {1: 0.80, 2: 0.82, 8: 0.84}.items():
                chosen = 80 if epsilon < 8 else 5
                add_run(mean + offset, task=task, data_id=task, seed=seed, epsilon_target=epsilon, epsilon=epsilon,
                        test_majority_rate=0.6, tuning=validation_tuning(chosen, space=space),
                        hyperparameters={"lr": 1.0, "epochs": chosen})
    code, lines = check(capsys)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(
        "boundary-hit: every task (add-remove) · validation · dpsgd · every ε: 8 of 12 selections at the top of the "
        "compute budget, 2.0 expected by chance"), lines
    assert lines[0].endswith("epochs high at ε = adult 1, adult 2, covertype 1, covertype 2, digits 1, digits 2, "
                             "kddcup99 1, kddcup99 2"), lines
