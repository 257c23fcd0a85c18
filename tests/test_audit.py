"""The one-run audit (dpbench/trust/audit.py, dpbench/trust/canaries.py): its bound against JAX Privacy's, honest methods pass,
planted defects and cheating plugins fail, the board's rule."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import optimize, special, stats

from dpbench import method
from dpbench.cli import main
from dpbench.privacy import clipping, ghost, sampling
from dpbench.results import store
from dpbench.trust import audit
from dpbench.trust.canaries import Canaries, CanaryModel

CHEATERS = str(Path(__file__).parent / "cheaters")
#: Short runs keep the suite fast; README's table (benchmarks/audit_table.py) uses the tasks' defaults.
EPOCHS = {"adult": 2, "digits": 10}
METHODS = ("dpsgd", "dpgd", "norm_bound", "adaclip", "ada_dp", "dpadam", "dpadam_bc")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# --- the bound ------------------------------------------------------------------------------------------------

def jax_privacy_p_value(m, n_guess, n_correct, eps, delta):
    """Transcribed for this test from JAX Privacy, jax_privacy/auditing.py, ``_one_run_p_value`` (the formula of
    Steinke et al., Theorem 3)."""
    q = special.expit(eps)
    beta = stats.binom.sf(n_correct - 1, n_guess, q)
    if delta == 0:
        return beta
    i_vals = np.arange(1, n_correct + 1)
    cum_sums = stats.binom.sf(n_correct - i_vals - 1, n_guess, q) - beta
    alpha = np.max(cum_sums / i_vals, initial=0)
    return min(beta + alpha * delta * 2 * m, 1)


def jax_privacy_epsilon(m, n_guess, n_correct, significance, delta, eps_lo=0.0):
    """Transcribed for this test from JAX Privacy's ``_epsilon_one_run``: the root of significance − p-value,
    bracketed by doubling."""
    if jax_privacy_p_value(m, n_guess, n_correct, eps_lo, 0) > significance:
        return eps_lo

    def objective(eps):
        return significance - jax_privacy_p_value(m, n_guess, n_correct, eps, delta)

    if objective(eps_lo) <= 0:
        return eps_lo
    eps_hi = max(1.0, 2 * eps_lo)
    while objective(eps_hi) > 0:
        eps_lo, eps_hi = eps_hi, eps_hi * 2
    return optimize.brentq(objective, eps_lo, eps_hi, xtol=1e-6)


@pytest.mark.parametrize("m, guesses, correct, delta, significance", [
    (1000, 100, 95, 1e-5, 0.05), (1000, 400, 386, 2.6e-7, 0.05 / 14), (100, 20, 20, 0.0, 0.05),
    (1000, 1000, 600, 1e-6, 0.05), (10000, 200, 190, 1e-3, 0.05), (1000, 10, 6, 1e-5, 0.05)])
def test_bound_matches_jax_privacy(m, guesses, correct, delta, significance):
    ours = audit.epsilon_lower_bound(m, guesses, correct, delta, significance)
    theirs = jax_privacy_epsilon(m, guesses, correct, significance, delta)
    assert ours == pytest.approx(theirs, abs=2e-6)
    for eps in (0.0, 0.5, 2.0):
        assert audit.p_value(m, guesses, correct, eps, delta) == pytest.approx(
            jax_privacy_p_value(m, guesses, correct, eps, delta), rel=1e-12)


def test_bound_by_hand():
    # δ = 0 and every guess right: P[Binomial(r, q) >= r] = q^r = β, so e^ε/(1 + e^ε) = β^(1/r)
    q = 0.05 ** (1 / 20)
    assert audit.epsilon_lower_bound(100, 20, 20, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-8)
    assert audit.epsilon_lower_bound(100, 20, 10, 0.0) == 0.0  # chance: nothing refuted
    assert audit.epsilon_lower_bound(100, 20, 20, 1e-3) < audit.epsilon_lower_bound(100, 20, 20, 0.0)


def test_guesses_split_the_significance_over_the_grid_and_scores():
    included = np.arange(100) % 2 == 0
    perfect = {"a": included.astype(float), "b": np.zeros(100)}
    result = audit.guess_and_bound(perfect, included, 0.0)
    rows = result["guess_grid"]
    assert len(rows) == 2 * 4  # k = 5, 10, 20, 50 for each of the two scores
    assert {row["score"] for row in rows if row["correct"] == row["guesses"]} == {"a"}
    best = max(rows, key=lambda row: row["epsilon_lower_bound"])
    assert result["epsilon_lower_bound"] == best["epsilon_lower_bound"] == audit.epsilon_lower_bound(
        100, best["guesses"], best["guesses"], 0.0, (1 - audit.CONFIDENCE) / len(rows))


# --- the canaries ---------------------------------------------------------------------------------------------

def test_canaries_leave_the_real_examples_alone():
    base = torch.nn.Linear(3, 2)
    model = CanaryModel(base, 3, 4, 2)
    x = torch.randn(5, 3)
    assert torch.equal(model(torch.cat([x, torch.zeros(5, 4)], 1)), base(x))
    canaries = Canaries(1000, seed=0)
    assert 450 < int(canaries.included.sum()) < 550
    assert torch.equal(canaries.included, Canaries(1000, seed=0).included)
    assert not torch.equal(canaries.included, Canaries(1000, seed=1).included)


def test_the_audit_task_is_named_as_the_task():
    """Issue 31: a plugin recognized the audit by its task's class name (``DigitsWithCanaries``)."""
    from dpbench import registry

    base = registry.tasks([])["digits"]
    audited = Canaries(20, seed=0).task_class(base)
    assert issubclass(audited, base) and audited is not base
    assert (audited.__name__, audited.__qualname__, audited.__module__, audited.__doc__) == \
        (base.__name__, base.__qualname__, base.__module__, base.__doc__)


def run_audit(method_name, task, **changes):
    changes.setdefault("overrides", {"epochs": EPOCHS[task]})
    return audit.audit(audit.AuditSpec(method=method_name, task=task, epsilon=1.0, **changes))


def test_canaries_are_ordinary_training_examples(mirror):
    record = run_audit("dpsgd", "digits")
    included = int(Canaries(1000, 0).included.sum())
    assert record["n_train"] == 1437 + included  # the included canaries are training rows
    assert record["data_id"] == "digits+1000-audit-canaries"
    # the ledger charged what ran, over the data with the canaries: the engine's own record of the run
    assert record["gradient_evaluations"] == record["steps"] == 10 * round((1437 + included) / record["hyperparameters"]["batch_size"])
    assert record["epsilon_claimed"] <= 1.0
    assert record["code"]["task"]["file"] == "tasks/linear.py" and not record["code"]["method"]["external"]
    assert store.load() == [] and store.load(kind="audit") == [record]  # not a benchmark run


# --- honest methods pass, planted defects fail -----------------------------------------------------------------

@pytest.mark.parametrize("task", ["adult", "digits"])
@pytest.mark.parametrize("method_name", METHODS)
def test_built_in_methods_pass_the_white_box_audit(mirror, method_name, task):
    record = run_audit(method_name, task)
    assert record["passed"] and record["epsilon_lower_bound"] <= record["epsilon_claimed"] <= 1.0


@pytest.fixture
def noise_divided_by_10(monkeypatch):
    original = method.GradientMechanism.mean_noise_std
    monkeypatch.setattr(method.GradientMechanism, "mean_noise_std", property(lambda self: original.fget(self) / 10))


@pytest.fixture
def clipping_off(monkeypatch):
    def unclipped(norms, max_norm, scale=1.0):
        return torch.full_like(norms, scale)

    monkeypatch.setattr(ghost, "clip_factors", unclipped)
    monkeypatch.setattr(clipping, "clip_factors", unclipped)


@pytest.fixture
def epoch_replay(monkeypatch):
    """The bug fixed on 22 November 2026: every epoch draws epoch 0's batches."""
    monkeypatch.setattr(sampling.PoissonSampler, "set_epoch", lambda self, epoch: None)


@pytest.mark.parametrize("defect", ["noise_divided_by_10", "clipping_off"])
def test_planted_defects_fail_the_audit(mirror, request, defect):
    request.getfixturevalue(defect)
    record = run_audit("dpsgd", "digits")
    assert not record["passed"] and record["epsilon_lower_bound"] > 1.0 >= record["epsilon_claimed"]


@pytest.mark.parametrize("cheater", ["cheat_keep_gradients", "cheat_stack_walker"])
def test_cheating_plugins_fail_the_audit(mirror, cheater):
    record = run_audit(cheater, "digits", plugins=[CHEATERS])
    assert record["code"]["method"]["external"]
    assert not record["passed"] and record["epsilon_lower_bound"] > 1.0 >= record["epsilon_claimed"]


def test_the_black_box_audit_passes_dpsgd_and_catches_noise_divided_by_10(mirror, request):
    honest = run_audit("dpsgd", "digits", threat_model="black-box")
    assert honest["passed"] and {row["score"] for row in honest["guess_grid"]} == {"loss"}
    request.getfixturevalue("noise_divided_by_10")
    leaky = run_audit("dpsgd", "digits", threat_model="black-box")
    assert not leaky["passed"] and leaky["epsilon_lower_bound"] > 1.0


def test_epoch_replay_moves_the_bound_but_is_not_caught(mirror, monkeypatch):
    """Measured, not a detection: with adult's default 10 epochs, batches replayed from epoch 0 make a canary's
    inclusions repeat at the same positions, which the position-max score sees (its bound rises), but a canary
    in one batch shifts that score by only about √10/σ = 1.9 noise units (σ = 1.68), too little for a bound above
    the claimed ε = 1 from 1000 canaries (README, "Auditing")."""
    honest = run_audit("dpsgd", "adult", overrides={})
    monkeypatch.setattr(sampling.PoissonSampler, "set_epoch", lambda self, epoch: None)
    replayed = run_audit("dpsgd", "adult", overrides={})

    def position_max(record):
        return max(row["epsilon_lower_bound"] for row in record["guess_grid"] if row["score"] == "position-max")

    assert position_max(replayed) > position_max(honest)
    assert replayed["passed"]


# --- the board's rule -----------------------------------------------------------------------------------------

def fake_audit(sha, task, passed, threat_model="white-box", ledger_version=audit.records.LEDGER_VERSION):
    return {"kind": "audit", "task": task, "passed": passed, "threat_model": threat_model,
            "ledger_version": ledger_version, "code": {"method": {"sha256": sha, "external": True}}}


def test_audit_status_and_the_board_mark():
    records = [fake_audit("a", "digits", True), fake_audit("a", "adult", True), fake_audit("a", "adult", False),
               fake_audit("b", "digits", True, "black-box"), fake_audit("c", "digits", True, ledger_version=1),
               {"kind": "run", "task": "digits"}]
    status = audit.audit_status(records)
    assert status == {("a", "digits"): "passed", ("a", "adult"): "failed"}
    run = {"task": "digits", "code": {"method": {"sha256": "a", "external": True}}}
    # an in-process plugin is never more than unverified, whatever its audit; the audit is shown as evidence
    assert audit.board_mark(run, status) == "unverified: in-process plugin, audit passed"
    assert audit.board_mark({**run, "isolation": "process"}, status) == "isolated, audit passed"
    assert audit.board_mark({**run, "task": "adult"}, status) == "unverified: in-process plugin, audit failed"
    assert audit.board_mark({**run, "code": {"method": {"sha256": "b", "external": True}}}, status) == \
        "unverified: in-process plugin, unaudited"
    assert audit.board_mark({**run, "code": {"method": {"sha256": "a", "external": False}}}, status) is None


def test_a_cheating_plugin_stays_unaudited_until_audited_and_then_fails(mirror, capsys):
    assert main(["audit", "--method", "cheat_keep_gradients", "--task", "digits", "--epsilon", "1",
                 "--epochs", "10", "--plugins", CHEATERS, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {"epsilon_claimed", "delta", "epsilon_lower_bound", "canaries", "guesses", "correct",
            "threat_model"} <= set(record)
    status = audit.audit_status(store.load(kind=None))
    run = {"task": "digits", "code": {"method": record["code"]["method"]}}
    assert audit.board_mark(run, status) == "unverified: in-process plugin, audit failed"
    assert audit.board_mark({**run, "task": "adult"}, status) == "unverified: in-process plugin, unaudited"


@pytest.mark.parametrize("args, message", [
    (["--method", "nonprivate", "--task", "digits"], "not a private gradient method"),
    (["--method", "amp", "--task", "digits"], "not a private gradient method"),
    (["--method", "dpsgd", "--task", "digits", "--canaries", "3"], "canaries must be"),
    (["--method", "dpsgd", "--task", "nope"], "unknown task"),
    (["--method", "dpsgd", "--task", "digits", "--seed", "-1"], "seed"),
])
def test_bad_audit_requests_are_refused(refused, args, message):
    assert message in refused("audit", *args)


# --- each check of audit.py and canaries.py, on input wrong in that one respect only ----------------------------

def test_each_request_check_alone():
    def check(**changes):
        return audit._check(audit.AuditSpec(**{"method": "dpsgd", "task": "digits", **changes}))

    assert check()[0].name == "dpsgd"  # the consistent request
    for changes, message in [({"threat_model": "grey-box"}, "unknown threat model"),
                             ({"canaries": audit.MAX_CANARIES + 1}, "canaries must be"),
                             ({"canaries": 100.0}, "canaries must be"), ({"seed": -1}, "seed")]:
        with pytest.raises(audit.UsageError, match=message):
            check(**changes)


def test_a_method_that_samples_shuffled_batches_is_refused(tmp_path):
    (tmp_path / "shuffled.py").write_text(
        "from dpbench.methods.dpsgd import DPSGD\n\n\nclass Shuffled(DPSGD):\n    name = 'dpsgd_shuffled'\n"
        "    description = 'DP-SGD on shuffled batches'\n    default_sampler = 'shuffle'\n")
    with pytest.raises(audit.UsageError, match="add/remove-one"):
        audit._check(audit.AuditSpec(method="dpsgd_shuffled", task="digits", plugins=[str(tmp_path)]))


@pytest.mark.parametrize("canaries, guesses, correct, delta, significance", [
    (10, 20, 20, 0.0, 0.05),  # more guesses than canaries
    (100, 20, 21, 0.0, 0.05),  # more right than guessed (without the check, the root search never ends)
    (100, 20, 20, 1.0, 0.05),  # δ = 1
    (100, 20, 20, 0.0, 0.0),  # significance 0
    (100, 20, 20, 0.0, 1.0),  # significance 1
])
def test_the_bound_refuses_inconsistent_counts(canaries, guesses, correct, delta, significance):
    audit.epsilon_lower_bound(100, 20, 20, 0.0, 0.05)  # the consistent input
    with pytest.raises(ValueError, match="need 0 <= correct"):
        audit.epsilon_lower_bound(canaries, guesses, correct, delta, significance)


def test_too_few_canaries_for_the_smallest_guess():
    included = np.arange(10) % 2 == 0
    assert audit.guess_and_bound({"a": included.astype(float)}, included, 0.0)["guesses"] == 10
    with pytest.raises(ValueError, match="need at least 10 canaries"):
        audit.guess_and_bound({"a": included[:9].astype(float)}, included[:9], 0.0)


def test_a_failed_audit_wins_over_a_later_pass():
    status = audit.audit_status([fake_audit("a", "digits", False), fake_audit("a", "digits", True)])
    assert status == {("a", "digits"): "failed"}


def test_a_black_box_pass_alone_does_not_count():
    assert audit.audit_status([fake_audit("a", "digits", True, "black-box")]) == {}
    assert audit.audit_status([fake_audit("a", "digits", True)]) == {("a", "digits"): "passed"}


def _task_and_data(**changes):
    from types import SimpleNamespace

    from dpbench.task import TaskData

    fields = {"x_train": torch.rand(6, 3), "y_train": torch.tensor([0, 1, 0, 1, 0, 1]), "x_test": torch.rand(4, 3),
              "y_test": torch.tensor([0, 1, 1, 0]), "data_id": "toy", "preprocessing": "none"}
    classes = changes.pop("classes", 2)
    fields.update(changes)
    return SimpleNamespace(name="toy", classes=classes, model=torch.nn.Linear(3, 1)), TaskData(**fields)


@pytest.mark.parametrize("changes, message", [
    ({"x_train": torch.rand(6, 3).to_sparse()}, "sparse"),
    ({"x_train": torch.rand(6, 3, 1)}, "flat float inputs"),
    ({"x_train": torch.randint(0, 5, (6, 3))}, "flat float inputs"),
    ({"classes": None}, "classification"),
    ({"y_train": torch.rand(6)}, "classification"),
])
def test_canaries_refuse_each_unsupported_task(changes, message):
    task, data = _task_and_data()
    assert Canaries(20, 0).attach(task, data).x_train.shape[1] == 3 + 20  # the consistent task
    task, data = _task_and_data(**changes)
    with pytest.raises(audit.UsageError, match=message):
        Canaries(20, 0).attach(task, data)
