"""Planted privacy defects: does the test suite catch each one?

Each mutant is one small textual change to the engine that makes a reported ε smaller than what ran (or leaks what
the record must not say). For each, this script applies the change to the working tree, runs the privacy part of
the test suite with ``pytest -x`` (stop at the first failure; the mutant's likely catcher first, so that the table
comes in minutes, then every other privacy test), restores the file, and reports whether a test
failed, which one, and how long it took to fail. Run it on a clean checkout, from the repository root, after any
change to privacy code::

    python benchmarks/privacy_mutants.py                 # every mutant; the table for docs/benchmarks.md
    python benchmarks/privacy_mutants.py --only rate-2q  # one mutant
    python benchmarks/privacy_mutants.py --json benchmarks/results/privacy_mutants.json
    python benchmarks/privacy_mutants.py --json benchmarks/results/privacy_mutants.json --resume  # after a stop

The files are restored in a ``finally`` block (and checked unmodified by git before each mutant), so an interrupted
run leaves the tree as it was. Exit status 1 if any mutant survives (no test failed) or a snippet no longer matches
the code (update the mutant). With ``--json`` the file is rewritten after every mutant, so a stopped run keeps what it
measured; ``--resume`` keeps the file's caught outcomes of mutants whose change and first test are unchanged and
runs only the others."""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The privacy part of the suite, in the order that catches most mutants soonest.
PRIVACY_TESTS = ["tests/test_guards.py", "tests/test_cache.py", "tests/test_streams.py", "tests/test_privacy.py", "tests/test_engine.py",
                 "tests/test_sampling.py", "tests/test_clipping.py", "tests/test_ghost.py", "tests/test_nonfinite.py", "tests/test_multiseed.py",
                 "tests/test_tuning.py", "tests/test_tuning_privacy.py", "tests/test_output_perturbation.py",
                 "tests/test_amp.py", "tests/test_cli.py", "tests/test_adaclip.py", "tests/test_ada_dp.py",
                 "tests/test_dpadam.py", "tests/test_mnist_tasks.py", "tests/test_isolation.py",
                 "tests/test_verify.py", "tests/test_adaptive_clipping.py", "tests/test_correlated.py",
                 "tests/test_requeue.py", "tests/test_study_setup.py"]


@dataclass(frozen=True)
class Mutant:
    name: str
    area: str
    defect: str
    file: str
    old: str
    new: str
    first: str = ""  # the test file (or test) to run first (only the order: the rest of the privacy tests follow)


MUTANTS = [
    Mutant("rate-2q", "sampling", "the Poisson sampler draws at 2q; record, calibration and ledger keep q",
           "dpbench/run/planning.py", "sampler = PoissonSampler(n, sample_rate, steps_per_epoch, per_step, sampler_seed)",
           "sampler = PoissonSampler(n, min(1.0, 2 * sample_rate), steps_per_epoch, per_step, sampler_seed)",
           first="tests/test_guards.py"),
    Mutant("epoch-replay", "sampling", "every epoch replays epoch 0's batches (the bug fixed on 22 November 2026)",
           "dpbench/privacy/sampling.py", 'return streams.generator(seed, "sampler", epoch)',
           'return streams.generator(seed, "sampler", 0)', first="tests/test_guards.py"),
    Mutant("shared-stream", "sampling", "the sampler's stream is the initial weights' (the review's collision)",
           "dpbench/privacy/sampling.py", 'return streams.generator(seed, "sampler", epoch)',
           'return streams.generator(seed, "init") if epoch == 0 else streams.generator(seed, "sampler", epoch)',
           first="tests/test_streams.py"),
    Mutant("noise-half", "noise scale", "the release's noise has standard deviation σC/(2B)",
           "dpbench/method.py", "return self.noise_multiplier * self.clip / self.expected_batch_size",
           "return self.noise_multiplier * self.clip / self.expected_batch_size / 2", first="tests/test_engine.py"),
    Mutant("no-clipping", "clipping", "per-example gradients are not clipped",
           "dpbench/privacy/clipping.py", "factors = (max_norm * scale) / norms.clamp_min(max_norm)",
           "factors = torch.full_like(norms, scale)", first="tests/test_clipping.py"),
    Mutant("adaclip-cancellation", "clipping", "AdaCliP's closed-form norm without its rounding bound (float32)",
           "dpbench/privacy/affine.py", "return ((sq + error) * (1 + 2.0**-22)).float()",
           "return (t1.float() - 2 * t2.float() + t3.float()).clamp_min(0)", first="tests/test_adaclip.py"),
    Mutant("mixing-layers", "clipping", "layers that mix examples (batch norm) are no longer refused",
           "dpbench/run/planning.py", "        guards.refuse_example_mixing(task, rows.first(data.x_test, 3))", "        pass",
           first="tests/test_guards.py"),
    Mutant("ledger-one-per-step", "ledger", "one release charged per step, whatever the method drew (ADADP: 2)",
           "dpbench/run/training.py", "self.releases += len(batches)", "self.releases += 1", first="tests/test_ada_dp.py"),
    Mutant("delta-tenfold", "δ", "the spent ε is computed at 10δ",
           "dpbench/run/engine.py", "spent = planned.releases_charged(module.releases).epsilon(planned.delta, spec.accountant)",
           "spent = planned.releases_charged(module.releases).epsilon(10 * planned.delta, spec.accountant)",
           first="tests/test_engine.py"),
    Mutant("calibrate-half-steps", "calibration", "σ calibrated for half the planned releases",
           "dpbench/run/planning.py", "planned_releases = hp[\"epochs\"] * steps_per_epoch * per_step",
           "planned_releases = max(1, hp[\"epochs\"] * steps_per_epoch * per_step // 2)", first="tests/test_engine.py"),
    Mutant("pair-unchecked", "calibration", "the gradient's σ and the count's σ_b are not checked at the multiplier "
           "finish charges (ulps above the calibrated one, where the PLD's ε can exceed the target)",
           "dpbench/run/planning.py", "        if not over_target(charged_epsilon(", "        if True or not over_target(charged_epsilon(",
           first="tests/test_adaptive_clipping.py::test_a_calibrated_pair_is_checked_at_the_multiplier_finish_charges"),
    Mutant("stepped-combined-unrecorded", "calibration", "a pair stepped up past a non-monotone ε records the first "
           "calibrated multiplier, not the one it was solved for (verify refuses the genuine record)",
           "dpbench/run/planning.py", "                sigma, extra, combined = _meets_target(",
           "                sigma, extra, _ = _meets_target(",
           first="tests/test_adaptive_clipping.py::test_a_pair_stepped_past_its_target_records_the_multiplier_it_was_"
                 "solved_for"),
    Mutant("trial-pair-unchecked", "tuning", "a tuning trial's (σ, σ_b) that combine below the trial's multiplier run",
           "dpbench/run/planning.py", "                if spec.noise_is_combined and combined < spec.noise_multiplier:",
           "                if False:",
           first="tests/test_adaptive_clipping.py::test_a_tuning_trials_pair_below_its_multiplier_is_refused_before_training"),
    Mutant("fractional-epochs-verified", "verify", "verify takes a fractional epochs (a banded run charged √1.5 "
           "participations for 2)", "dpbench/trust/plan_checks.py",
           '        _check_whole(hp.get(key), f"hyperparameters.{key}")', "        pass",
           first="tests/test_correlated.py::test_a_bandmf_record_is_charged_and_verify_recomputes_it"),
    Mutant("split-label-unchecked", "verify", "any non-integer split seed makes verify check n_train loosely",
           "dpbench/trust/plan_checks.py",
           "        if seed != \"secret\" and (not isinstance(seed, int) or isinstance(seed, bool)):",
           "        if False:",
           first="tests/test_verify.py::test_a_tuned_records_split_is_the_one_its_configuration_and_seed_name"),
    Mutant("correlated-without-philox", "correlated noise", "a correlated run starts without the counter-based "
           "sampler (trains in full, then is refused)", "dpbench/run/refusals.py",
           '"fall back to PyTorch\'s generator and be refused at its end)": noise.fill_normal is None}',
           '"fall back to PyTorch\'s generator and be refused at its end)": False}',
           first="tests/test_correlated.py::test_correlated_noise_without_the_fast_sampler_is_refused_before_training"),
    Mutant("failed-trials-printed", "tuning", "random stopping prints a line per failed trial (a lower bound on K)",
           "dpbench/tuning/trials.py", "        if plan_.spec.mode != \"random-stopping\":  # there K is hidden",
           "        if True:  # there K is hidden",
           first="tests/test_tuning.py::test_a_count_methods_trials_draw_the_combined_noise_the_tuning_charges"),
    Mutant("sweep-plans-correlated-as-poisson", "tuning", "the sweep plans a correlated method's random-stopping cell "
           "with Poisson batches (its cells refused)", "dpbench/board/sweep.py",
           "                                             else plan_.trial.sampler))",
           '                                             else "poisson"))',
           first="tests/test_sweep.py::test_the_random_stopping_track_runs_the_count_and_correlated_methods_and_resumes"),
    Mutant("trial-correlation-after-training", "tuning", "a trial whose hyperparameters change the noise correlation "
           "trains before it fails", "dpbench/tuning/trials.py",
           "    if planning.correlated_fields(found) != (trial.bands, trial.tree):",
           "    if False:",
           first="tests/test_tuning.py::test_a_trial_whose_correlation_is_not_the_tunings_fails_before_training"),
    Mutant("validation-fields-unbound", "verify", "a tuned record's validation fields alone name its split (another "
           "split seed or fraction, n_train and ε made to match, passes)", "dpbench/trust/plan_checks.py",
           "            if value != named or isinstance(value, bool) != isinstance(named, bool):",
           "            if False:",
           first="tests/test_verify.py::test_a_tuned_records_split_is_the_one_its_configuration_and_seed_name"),
    Mutant("trial-warnings-per-trial", "tuning", "random stopping shows a run's warning once per trial (K lines)",
           "dpbench/tuning/trials.py", "    if not hidden:\n        yield\n        return",
           "    if True:\n        yield\n        return",
           first="tests/test_tuning.py::test_random_stopping_shows_a_trials_warning_once_not_once_per_trial"),
    Mutant("float-sizes-accepted", "verify", "an epochs or batch size given as a float trains (its record states a "
           "float)", "dpbench/checks.py", "    return isinstance(value, int) and not isinstance(value, bool)",
           "    return isinstance(value, (int, float)) and float(value).is_integer()",
           first="tests/test_engine.py::test_a_size_given_as_anything_but_an_int_is_refused_before_training"),
    Mutant("calibration-trusts-guess", "calibration", "σ is the central limit theorem's guess, not the PLD's answer "
           "(the guess is below it at small ε)", "dpbench/privacy/accounting.py",
           "    fine = lambda s: _make_accountant(accountant, neighbouring).compose(releases_with(s)).get_epsilon(delta)\n",
           "    sigma = guess[0] if guess else sigma\n"
           "    fine = lambda s: _make_accountant(accountant, neighbouring).compose(releases_with(s)).get_epsilon(delta)\n",
           first="tests/test_privacy.py"),
    Mutant("verify-rdp-cache-ignores-relation", "verify", "verify's RDP curves are cached without their relation: "
           "a replace-one trial is checked against its add/remove curve", "dpbench/trust/recompute.py",
           "    key = (repr(event), tuple(float(a) for a in orders), relation)",
           "    key = (repr(event), tuple(float(a) for a in orders))", first="tests/test_verify.py"),
    Mutant("verify-spread-claims-cover", "verify", "verify's numerical-error spread reports the shortfall covered "
           "after its first variant, whatever the variants say: a record claiming less ε than it spent passes",
           "dpbench/trust/recompute.py", "            if max(values) - min(values) > beyond:\n                break",
           "            if beyond < math.inf:\n                return 2 * beyond", first="tests/test_verify.py"),
    Mutant("verify-accepts-infinite-epsilon", "verify", "a mechanism with no finite ε at the record's δ (δ = 0, "
           "a non-private data release) passes whatever ε the record states", "dpbench/trust/recompute.py",
           "    if not math.isfinite(spent):\n", "    if False:\n", first="tests/test_verify.py"),
    Mutant("verify-accepts-nan-epsilon", "verify", "a recorded ε of NaN passes (every comparison with NaN is false)",
           "dpbench/trust/recompute.py", " or isinstance(recorded, bool) or math.isnan(recorded):",
           " or isinstance(recorded, bool):", first="tests/test_verify.py"),
    Mutant("verify-tuned-ignores-target", "verify", "a tuned record's whole-tuning ε is never compared with its "
           "target: a record spending 8 sits in the ε = 0.1 column", "dpbench/trust/record_checks.py",
           '    if target is not None and whole - _rdp_error(whole)() > target * (1 + 1e-9):',
           '    if False:', first="tests/test_verify.py"),
    Mutant("verify-delta-unbounded", "verify", "δ is not required to lie in (0, 1): at δ = 1 any claimed ε passes",
           "dpbench/trust/recompute.py", "    if isinstance(delta, bool) or not isinstance(delta, (int, float)) "
           "or not 0 < delta < 1:", "    if False:", first="tests/test_verify.py"),
    Mutant("verify-trusts-private-flag", "verify", "a random-stopping record marked tuning.private = false is "
           "checked as one trial's ε", "dpbench/trust/record_checks.py",
           '    if tuning.get("mode") in PRIVATE_MODES and not tuning.get("private"):',
           '    if False:', first="tests/test_verify.py"),
    Mutant("verify-infinite-error-excuses", "verify", "an infinite numerical error (δ at the PLD tail's edge) "
           "excuses any shortfall", "dpbench/trust/recompute.py",
           "    if not math.isfinite(error(beyond=shortfall)):",
           "    if False:", first="tests/test_verify.py"),
    Mutant("verify-nan-passes-as-positive", "verify", "a NaN ε target or score-noise σ passes (NaN compares false "
           "with everything)", "dpbench/trust/recompute.py",
           "    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and "
           "value > 0):", "    if False:", first="tests/test_verify.py"),
    Mutant("verify-kind-by-fields", "verify", "a record is checked by the fields it carries: a gradient run given a "
           "one-part release ledger is charged one Gaussian", "dpbench/trust/record_checks.py",
           "            _check_kind(record)\n", "", first="tests/test_verify.py::test_a_gradient_run_given_a_release_ledger_fails"),
    Mutant("verify-tuned-trials-unchecked", "verify", "a tuned record's method and task are not checked for releases "
           "its trials do not charge (a count, correlated noise, DP-PCA)", "dpbench/trust/record_checks.py",
           "    else:\n        _check_tuned_gradient_trials(record)", "    else:\n        pass",
           first="tests/test_verify.py"),
    Mutant("verify-delta-above-one-over-n", "verify", "δ ≥ 1/n passes without the record saying it was forced",
           "dpbench/trust/record_checks.py", "            _check_delta_below_one_over_n(record)\n", "",
           first="tests/test_verify.py::test_a_delta_of_at_least_one_over_n_fails_unless_the_record_says_it_was_forced"),
    Mutant("verify-audit-grid-unchecked", "verify", "an audit record with rows of its guess grid dropped passes",
           "dpbench/trust/record_checks.py", '    if [(row["score"], row["k"], row["guesses"]) for row in rows] != grid:',
           "    if False:", first="tests/test_verify.py"),
    Mutant("verify-audit-confidence-unchecked", "verify", "an audit record re-graded at a higher confidence passes",
           "dpbench/trust/record_checks.py", '    if record["confidence"] != audit.CONFIDENCE:  # a higher confidence lowers every bound',
           "    if False:", first="tests/test_verify.py"),
    Mutant("verify-n-train-unchecked", "verify", "n_train is not tied to the task's data: ten times n, ten times the "
           "steps, a tenth of q", "dpbench/trust/record_checks.py", "            reasons.append(check_n_train(record))",
           "            reasons.append(None)",
           first="tests/test_verify.py::test_an_n_train_that_is_not_the_tasks_data_fails"),
    Mutant("verify-test-set-unchecked", "verify", "n_test and test_majority_rate, which the board's interval and "
           "collapsed checks read, are not tied to the task's test set", "dpbench/trust/record_checks.py",
           "            reasons.append(check_test_set(record))", "            reasons.append(None)",
           first="tests/test_verify.py::test_a_test_set_that_is_not_the_tasks_fails"),
    Mutant("verify-amp-fractions-unchecked", "verify", "AMP's noise and output fractions are not required in (0, 1)",
           "dpbench/trust/release_checks.py",
           "        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:\n"
           "            raise Mismatch(f\"AMP's", "        if False:\n            raise Mismatch(f\"AMP's",
           first="tests/test_verify.py::test_an_amp_record_with_a_noise_fraction_above_one_fails"),
    Mutant("verify-amp-output-sensitivity", "verify", "AMP's output sensitivity 2nγ/Λ is not re-derived",
           "dpbench/trust/release_checks.py", "        if output:\n            _close(out_sensitivity",
           "        if False:\n            _close(out_sensitivity", first="tests/test_verify.py::"
           "test_an_amp_record_whose_output_sensitivity_is_not_two_n_gamma_over_lambda_fails"),
    Mutant("verify-code-name-unchecked", "verify", "a built-in's record renamed as a plugin escapes the built-in's "
           "checks", "dpbench/trust/record_checks.py", "            _check_code(record)\n", "",
           first="tests/test_verify.py::test_a_built_in_record_renamed_as_a_plugin_fails"),
    Mutant("verify-tuning-analysis-by-fields", "verify", "the tuning's analysis follows the fields present, not the "
           "mode: an adaptive record given a K distribution is charged as random stopping",
           "dpbench/trust/record_checks.py", '    random_k = tuned["mode"] == "random-stopping"',
           '    random_k = "k_distribution" in tuned',
           first="tests/test_verify.py::test_an_adaptive_record_charged_as_random_stopping_fails"),
    Mutant("verify-audit-claim-above-spent", "verify", "an audit may claim more ε than its run spent (a failure "
           "then reads as a pass)", "dpbench/trust/record_checks.py",
           "    if excess > 0 and (excess > MAX_ERROR", "    if False and (excess > MAX_ERROR",
           first="tests/test_verify.py::test_an_audit_that_failed_cannot_pass_by_claiming_more_than_its_run_spent"),
    Mutant("verify-tuned-record-not-private", "verify", "a privately tuned record marked private = false skips the δ "
           "and code checks", "dpbench/trust/record_checks.py",
           '    if tuning.get("private") and record.get("private") is not True:', "    if False:",
           first="tests/test_verify.py::test_a_tuned_record_marked_not_private_fails"),
    Mutant("audit-pass-ignores-delta", "audit", "an audit's pass counts for runs at another δ", "dpbench/trust/marks.py",
           '"epsilon_target", "delta", "neighbouring"', '"epsilon_target", "neighbouring"',
           first="tests/test_audit.py::test_an_audit_passed_at_other_settings_is_shown_as_such"),
    Mutant("verify-tuned-untunable-release", "verify", "a privately tuned AMP record (AMP has no per-trial curve) "
           "passes with its parts charged as Gaussians", "dpbench/trust/record_checks.py",
           '        if method is not None and not getattr(method, "tunable_privately", False):', "        if False:",
           first="tests/test_verify.py::test_a_privately_tuned_amp_record_fails"),
    Mutant("verify-private-flag-vs-method", "verify", "a non-private method's record marked private passes",
           "dpbench/trust/record_checks.py", '    if method is not None and record.get("kind", "run") == "run" and '
           'record.get("private", True) != method.private:', "    if False:",
           first="tests/test_verify.py::test_a_nonprivate_methods_record_marked_private_fails"),
    Mutant("verify-task-options-unvalidated", "verify", "task options the task rejects pass (and drop its DP-PCA)",
           "dpbench/trust/plan_checks.py", "    if problem is not None:\n        raise Mismatch(f\"task {task.name} rejects",
           "    if False:\n        raise Mismatch(f\"task {task.name} rejects",
           first="tests/test_verify.py::test_task_options_the_task_rejects_fail"),
    Mutant("verify-secret-split-unbounded", "verify", "a tuned record with a secret split may state any n_train",
           "dpbench/trust/plan_checks.py", '            if not abs(record["n_train"] - (1 - fraction) * n) <= spread:',
           "            if False:", first="tests/test_verify.py::test_a_secret_split_still_bounds_n_train"),
    Mutant("verify-unknown-tuning-mode", "verify", "a tuning mode verify does not know is checked as one run",
           "dpbench/trust/record_checks.py", '    if tuning and tuning.get("mode") not in KNOWN_MODES:',
           "    if False:", first="tests/test_verify.py::test_an_unknown_tuning_mode_fails"),
    Mutant("verify-release-relation", "verify", "a built-in release record relabelled add/remove-one passes",
           "dpbench/trust/release_checks.py",
           '    if method is not None and issubclass(method, ReleaseMethod) and relation != "replace-one":',
           "    if False:", first="tests/test_verify.py::test_a_release_record_relabelled_add_remove_fails"),
    Mutant("verify-ledger-relation", "verify", "a ledger part accounted under another relation than the record's "
           "passes", "dpbench/trust/release_checks.py", '        if entry.get("neighbours") != relation:',
           "        if False:", first="tests/test_verify.py::test_a_release_record_relabelled_add_remove_fails"),
    Mutant("verify-op-radius-unchecked", "verify", "output perturbation's strongly convex bound with a radius ≤ 0 "
           "(Δ 10⁶ times too small) passes", "dpbench/trust/release_checks.py",
           '''        _check_positive(hp["regularization"], "regularization")
        _check_positive(hp["radius"], "radius")''', "        pass",
           first="tests/test_verify.py::test_output_perturbation_settings_its_bounds_do_not_cover_fail"),
    Mutant("verify-op-step-unbounded", "verify", "output perturbation's convex bound with a step above 2/β passes",
           "dpbench/trust/release_checks.py", "        if lr > 2 / (lipschitz**2 / 4) * (1 + 1e-12):",
           "        if False:", first="tests/test_verify.py::test_output_perturbation_settings_its_bounds_do_not_cover_fail"),
    Mutant("verify-audit-of-nonprivate", "verify", "an audit of a non-private method passes",
           "dpbench/trust/record_checks.py", "(issubclass(method, ReleaseMethod) or not method.private)",
           "issubclass(method, ReleaseMethod)", first="tests/test_verify.py::test_an_audit_of_a_non_private_method_fails"),
    Mutant("relation-swapped", "calibration", "replace-one accounted as add/remove-one",
           "dpbench/privacy/accounting.py", '"replace-one": dp_accounting.NeighboringRelation.REPLACE_ONE}',
           '"replace-one": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE}', first="tests/test_privacy.py"),
    Mutant("tuning-one-trial", "tuning", "random stopping charged as one trial (K ignored)",
           "dpbench/tuning/accounting.py", "ORDERS, trial.curve(), distribution[\"mean\"], k_shape(distribution)))",
           "ORDERS, trial.curve(), 1.0, k_shape(distribution)))", first="tests/test_tuning.py"),
    Mutant("tuning-shuffle-trials", "tuning", "trials sample with the method's default sampler, not Poisson",
           "dpbench/tuning/trials.py", 'noise_is_combined=True, sampler=plan_.trial.sampler,',
           'noise_is_combined=True, sampler=None,', first="tests/test_tuning.py"),
    Mutant("tuning-score-noise", "tuning", "the validation score's noise is a tenth of what parallel composition needs",
           "dpbench/tuning/accounting.py", "return math.sqrt(float(np.max(ORDERS / (2 * trial.curve())))) * (1 + 1e-9)",
           "return math.sqrt(float(np.max(ORDERS / (2 * trial.curve())))) * (1 + 1e-9) / 10",
           first="tests/test_tuning_privacy.py"),
    Mutant("replace-one-curve", "tuning", "the tuning's replace-one curve taken as the add/remove one",
           "dpbench/privacy/accounting.py", "    if neighbouring == \"add-remove\":\n        accountant = rdp.RdpAccountant",
           "    if True:\n        accountant = rdp.RdpAccountant", first="tests/test_tuning_privacy.py"),
    Mutant("tuning-reveals-k", "tuning", "the released record says how many trials ran",
           "dpbench/tuning/released.py", '"selected_params": best.params, "study": study.study_name,',
           '"selected_params": best.params, "trials_run": k, "study": study.study_name,', first="tests/test_tuning.py"),
    Mutant("tuning-reveals-batch", "tuning", "the release of studies tuned together says how many trials trained "
           "with it (the sum of their K)", "dpbench/tuning/released.py",
           'TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "batched_seeds", "train_seconds", "clipping")',
           'TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "train_seconds", "clipping")',
           first="tests/test_tuning.py"),
    Mutant("tuning-reveals-batched-or-alone", "tuning", "the release of studies tuned together says whether its "
           "trial trained in their batch or alone (another trial's refusal sends them one by one)",
           "dpbench/tuning/released.py",
           'TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "batched_seeds", "train_seconds", "clipping")',
           'TRIAL_ONLY_FIELDS = ("run_id", "created_at", "validation", "batched_seeds", "train_seconds")',
           first="tests/test_tuning.py"),
    Mutant("multiseed-noise", "batched seeds", "batched seeds add noise for twice the expected batch size",
           "dpbench/run/multiseed.py", "scales = torch.tensor([1 / module.expected_batch_size for module in modules]",
           "scales = torch.tensor([0.5 / module.expected_batch_size for module in modules]",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-ledger", "batched seeds", "batched runs charge one release per step to the first run only",
           "dpbench/run/multiseed.py",
           "            if modules[index].method_class.private:\n                releases[index]",
           "            if index == active[0] and modules[index].method_class.private:\n"
           "                releases[index]",
           first="tests/test_multiseed.py"),
    Mutant("output-noise-half", "release methods", "output perturbation adds half the calibrated noise",
           "dpbench/release/mechanisms.py", "    std = sigma * sensitivity\n", "    std = sigma * sensitivity / 2\n",
           first="tests/test_output_perturbation.py"),
    Mutant("amp-sensitivity", "release methods", "AMP's output noise for the paper's nγ/Λ instead of 2nγ/Λ",
           "dpbench/release/mechanisms.py", "out_sensitivity = 2 * n * gamma / regularization",
           "out_sensitivity = n * gamma / regularization", first="tests/test_amp.py"),
    # issue 31: tuning secrets, secret seeds and the independence of a study's trials
    Mutant("tuning-secret-from-seed", "tuning", "the study's secret is the public seed again: every released record "
           "gives away K and which trial won", "dpbench/tuning/study.py",
           '{"secret": streams.secret_seed(),', '{"secret": plan_.spec.seed,',
           first="tests/test_tuning.py"),
    Mutant("tuning-same-run-seed", "tuning", "every trial of a study trains with trial 0's run seed (weights, "
           "batches, noise)", "dpbench/tuning/trials.py", 'seed=streams.child_seed(secret, "tuning-trial", number),',
           'seed=streams.child_seed(secret, "tuning-trial", 0),', first="tests/test_tuning.py"),
    Mutant("tuning-same-search-draw", "tuning", "every trial of a study draws trial 0's hyperparameters",
           "dpbench/tuning/trials.py", 'seed = streams.derive(secret, "tuning-search", trial_number) % 2**32',
           'seed = streams.derive(secret, "tuning-search", 0) % 2**32', first="tests/test_tuning.py"),
    Mutant("tuning-same-score-noise", "tuning", "every trial's validation score gets trial 0's noise",
           "dpbench/tuning/trials.py",
           'ValidationSplit(plan_.validation["fraction"], secret, plan_.validation["noise_multiplier"], number,',
           'ValidationSplit(plan_.validation["fraction"], secret, plan_.validation["noise_multiplier"], 0,',
           first="tests/test_tuning.py"),
    Mutant("secret-seed-record-keeps-seed", "secret seed", "a --secret-seed run's record and W&B config carry its "
           "seed", "dpbench/run/planning.py", '"secret" if spec.secret_seed else spec.seed, hp | options,',
           "spec.seed, hp | options,", first="tests/test_cli.py"),
    Mutant("secret-seed-not-drawn", "secret seed", "--secret-seed runs with the default seed 0 (not from the OS's "
           "entropy) and still says \"secret\"", "dpbench/run/planning.py",
           "spec = replace(spec, seed=streams.secret_seed())", "spec = replace(spec, seed=spec.seed)",
           first="tests/test_cli.py"),
    Mutant("tuning-secret-seed-record-keeps-seed", "secret seed", "a --secret-seed study's record carries its seed",
           "dpbench/tuning/released.py", 'record.update({"seed": "secret" if spec.secret_seed else spec.seed,',
           'record.update({"seed": spec.seed,', first="tests/test_tuning.py"),
    # issue 31: isolated methods, the board's plugin marks, and each check of the audit and its canaries
    Mutant("isolation-ignored", "isolation", "--isolate records \"process\" but runs the method in-process",
           "dpbench/run/training.py", "self.method = IsolatedMethod(method, self.params(), hp, self.mechanism) if isolate",
           "self.method = IsolatedMethod(method, self.params(), hp, self.mechanism) if False",
           first="tests/test_isolation.py"),
    Mutant("isolation-clip-change", "isolation", "an isolated method may change the engine's clip C in its hp",
           "dpbench/run/isolation.py",
           'changed = [key for key in ENGINE_KEYS if key in hp and reply["ready"].get(key) != hp[key]]',
           "changed = []", first="tests/test_isolation.py"),
    Mutant("isolation-transform-code", "isolation", "a per-example transform that is code is not refused isolated",
           "dpbench/run/isolation.py", "    if not isinstance(transform, CoordinateAffine):\n        raise UsageError",
           "    if False:\n        raise UsageError", first="tests/test_isolation.py"),
    Mutant("board-in-process-isolated", "board", "an in-process plugin's row is marked \"isolated\"",
           "dpbench/trust/marks.py",
           'trust = "isolated" if isolation == "process" else "unverified: in-process plugin"',
           'trust = "isolated"', first="tests/test_audit.py"),
    Mutant("board-built-in-marked", "board", "a built-in method gets a plugin mark",
           "dpbench/trust/audit.py", '    if not code.get("external"):\n        return None\n    isolation =',
           "    isolation =", first="tests/test_audit.py"),
    Mutant("audit-any-hyperparameters", "board", "a plugin's audit pass marks its cells of other settings",
           "dpbench/trust/marks.py", "if runs and all(settings_key(run) in audited for run in runs):",
           "if True:", first="tests/test_audit.py"),
    Mutant("audit-threat-model", "audit", "an unknown threat model is not refused",
           "dpbench/trust/audit.py", "    if spec.threat_model not in THREAT_MODELS:", "    if False:",
           first="tests/test_audit.py"),
    Mutant("audit-canaries-range", "audit", "more canaries than MAX_CANARIES are accepted",
           "dpbench/trust/audit.py", "not 2 * GUESS_GRID[0] <= spec.canaries <= MAX_CANARIES:",
           "not 2 * GUESS_GRID[0] <= spec.canaries:", first="tests/test_audit.py"),
    Mutant("audit-canaries-int", "audit", "a fractional number of canaries is accepted",
           "dpbench/trust/audit.py", "    if not isinstance(spec.canaries, int) or not", "    if not",
           first="tests/test_audit.py"),
    Mutant("audit-seed", "audit", "the audit does not check its seed before loading anything",
           "dpbench/trust/audit.py", "    check_seed(spec.seed)", "    pass", first="tests/test_audit.py"),
    Mutant("audit-nonprivate", "audit", "a non-private method is audited",
           "dpbench/trust/audit.py", "if issubclass(method, ReleaseMethod) or not method.private:",
           "if issubclass(method, ReleaseMethod):", first="tests/test_audit.py"),
    Mutant("audit-release-method", "audit", "an output/objective perturbation method is audited as a gradient method",
           "dpbench/trust/audit.py", "if issubclass(method, ReleaseMethod) or not method.private:",
           "if not method.private:", first="tests/test_audit.py"),
    Mutant("audit-add-remove", "audit", "the audit compares its bound with the run's add/remove ε, though a coin's "
           "flip replaces one example by another", "dpbench/trust/audit.py", 'neighbouring="replace-one",',
           'neighbouring="add-remove",', first="tests/test_audit.py"),
    Mutant("bound-order", "audit", "the bound accepts more right guesses than guesses, or guesses than canaries",
           "dpbench/trust/audit.py", "if not (0 <= correct <= guesses <= canaries and", "if not (0 <= correct and",
           first="tests/test_audit.py"),
    Mutant("bound-delta", "audit", "the bound accepts δ = 1", "dpbench/trust/audit.py",
           "and 0 <= delta < 1 and", "and 0 <= delta and", first="tests/test_audit.py"),
    Mutant("bound-significance", "audit", "the bound accepts a significance of 0", "dpbench/trust/audit.py",
           "0 < significance < 1):", "significance < 1):", first="tests/test_audit.py"),
    Mutant("guess-grid-empty", "audit", "fewer canaries than the smallest guess are not refused by name",
           "dpbench/trust/audit.py", '    if not grid:\n        raise ValueError(f"need at least',
           '    if False:\n        raise ValueError(f"need at least', first="tests/test_audit.py"),
    Mutant("audit-status-pass-after-fail", "audit", "a later passed audit overrides a failed one",
           "dpbench/trust/marks.py", "        if key in self.failed:", "        if False:", first="tests/test_audit.py"),
    Mutant("audit-status-black-box", "audit", "a black-box pass counts as a pass",
           "dpbench/trust/audit.py", "        elif _current_white_box(record):", "        else:",
           first="tests/test_audit.py"),
    Mutant("canaries-sparse", "audit", "canaries are put into sparse inputs",
           "dpbench/trust/canaries.py", "        if x.is_sparse:\n", "        if False:\n", first="tests/test_audit.py"),
    Mutant("canaries-flat", "audit", "canaries are put into inputs that are not flat rows",
           "dpbench/trust/canaries.py", "if x.dim() != 2 or not x.is_floating_point():", "if not x.is_floating_point():",
           first="tests/test_audit.py"),
    Mutant("canaries-float", "audit", "canaries are put into integer inputs",
           "dpbench/trust/canaries.py", "if x.dim() != 2 or not x.is_floating_point():", "if x.dim() != 2:",
           first="tests/test_audit.py"),
    Mutant("canaries-classes", "audit", "canaries are added to a task without a number of classes",
           "dpbench/trust/canaries.py",
           "if not isinstance(classes, int) or classes < 2 or data.y_train.dtype != torch.long:",
           "if data.y_train.dtype != torch.long:", first="tests/test_audit.py"),
    Mutant("canaries-labels", "audit", "canaries are added to a task with real-valued labels",
           "dpbench/trust/canaries.py",
           "if not isinstance(classes, int) or classes < 2 or data.y_train.dtype != torch.long:",
           "if not isinstance(classes, int) or classes < 2:", first="tests/test_audit.py"),
    Mutant("canaries-say-audit", "audit", "the data the method can reach says it is the audit's (its data id)",
           "dpbench/trust/canaries.py", "        return replace(data, x_train=x, y_train=y)",
           '        return replace(data, x_train=x, y_train=y, data_id=f"{data.data_id}+audit")',
           first="tests/test_audit.py"),
    Mutant("canaries-added", "audit", "the canaries are added to the rows instead of taking their places (n grows)",
           "dpbench/trust/canaries.py", "        return replace(data, x_train=x, y_train=y)",
           "        return replace(data, x_train=torch.cat([data.x_train, self.inputs]),\n"
           "                       y_train=torch.cat([data.y_train, y[self.rows]]))", first="tests/test_audit.py"),
    Mutant("canaries-rows", "audit", "more canaries than training rows are accepted", "dpbench/trust/canaries.py",
           "        if m > len(x):\n", "        if False:\n", first="tests/test_audit.py"),
    Mutant("audit-status-old-design", "audit", "a pass with the canaries a plugin could see counts on the board",
           "dpbench/trust/audit.py", '            and record.get("canary_design") == CANARY_DESIGN\n', "\n",
           first="tests/test_audit.py"),
    # issue 31: verify (plan counts, error bound, whole-record reruns) and the checkpoint's ledger
    Mutant("verify-counts-from-record", "verify", "verify takes the releases and steps from the record, not from its "
           "plan (the forged 420 -> 42 count passes)", "dpbench/trust/plan_checks.py",
           "    if (steps, releases) != (planned, k * planned):", "    if False:", first="tests/test_verify.py"),
    Mutant("verify-rate-from-record", "verify", "verify takes q from the record, not from its batch size and n",
           "dpbench/trust/plan_checks.py", "    if q != batch / n:", "    if False:", first="tests/test_verify.py"),
    Mutant("verify-full-batch", "verify", "a full-batch method's record may state a batch smaller than n",
           "dpbench/trust/plan_checks.py", "    if method is not None and method.full_batch and batch != n:", "    if False:",
           first="tests/test_verify.py"),
    Mutant("verify-shuffle-add-remove", "verify", "shuffled or cyclic batches accepted under add/remove neighbours",
           "dpbench/trust/record_checks.py", '    if record["sampler"] in ("shuffle", "cyclic") and relation != "replace-one":',
           "    if False:", first="tests/test_verify.py"),
    Mutant("verify-rdp-replace-one", "verify", "RDP of a replace-one Poisson run accepted as its add/remove curve",
           "dpbench/trust/recompute.py", '    raise Mismatch(f"no replace-one RDP analysis of {type(event).__name__}: such a '
           'record needs the pld accountant")', "    return event", first="tests/test_verify.py"),
    Mutant("verify-target", "verify", "a gradient run's spent ε above its target is accepted", "dpbench/trust/record_checks.py",
           "    if target is not None and spent > target * (1 + 1e-9) and spent - min(",
           "    if False and spent - min(", first="tests/test_verify.py"),
    Mutant("verify-release-target", "verify", "a release method's ε above its target is accepted",
           "dpbench/trust/release_checks.py", '    if record["epsilon"] > record["epsilon_target"] * (1 + 1e-9):', "    if False:",
           first="tests/test_verify.py"),
    Mutant("verify-no-noise", "verify", "a run without noise (σ = 0) is accepted if it states ε = ∞",
           "dpbench/trust/record_checks.py", '    if not record.get("noise_multiplier", 0) > 0:', "    if False:",
           first="tests/test_verify.py"),
    Mutant("verify-tuned-relation", "verify", "a tuned record's relation may differ from its tuning's",
           "dpbench/trust/record_checks.py",
           '    if tuned.get("neighbouring", "add-remove") != record.get("neighbouring", "add-remove"):',
           "    if False:", first="tests/test_verify.py"),
    Mutant("verify-score-noise", "verify", "a tuning's score noise is not checked against its trial's RDP",
           "dpbench/trust/record_checks.py", "    if np.any(orders / (2 * sigma_v**2) > trial * (1 + 1e-9)):", "    if False:",
           first="tests/test_verify.py"),
    Mutant("verify-audit-passed", "verify", "an audit's passed is not checked against its bound and claim",
           "dpbench/trust/record_checks.py",
           '    if record["passed"] != (record["epsilon_lower_bound"] <= record["epsilon_claimed"]):', "    if False:",
           first="tests/test_verify.py"),
    Mutant("verify-error-tenfold", "verify", "a record may state ε below the recomputation by 10x the accountant's "
           "error bound", "dpbench/trust/recompute.py",
           "    if shortfall > error(beyond=shortfall):",
           "    if shortfall > 10 * error():", first="tests/test_verify.py"),
    Mutant("verify-rerun-metrics-only", "verify", "--rerun compares only the metrics (a restated ε passes)",
           "dpbench/trust/rerun.py", "differences = _differences(_without_hashes(again), _without_hashes({**ran_in, **record}),",
           'differences = _differences(again["metrics"], record["metrics"], 0.0) if True else _differences(again, '
           '{**ran_in, **record},',
           first="tests/test_verify.py"),
    Mutant("resume-edited-ledger", "checkpoints", "a resumed run takes its checkpoint's ledger unchecked",
           "dpbench/run/checkpoint.py", "    check_ledger(planned, saved, folder)\n", "", first="tests/test_resume.py"),
    Mutant("verify-release-sigma", "verify", "a release method's noise_multiplier is not checked against its ledger",
           "dpbench/trust/release_checks.py", '    _close(ledger[0]["noise_std"] / ledger[0]["sensitivity"], record["noise_multiplier"], '
           '"noise_multiplier")', "    pass", first="tests/test_verify.py"),
    Mutant("verify-release-delta", "verify", "a release method's δ is not checked against the sum of its parts'",
           "dpbench/trust/release_checks.py", '    _close(math.fsum(entry["delta"] for entry in ledger), record["delta"], '
           '"delta (sum of the ledger)")', "    pass", first="tests/test_verify.py"),
    Mutant("verify-wu-sensitivity", "verify", "output perturbation's sensitivity is not re-derived (Wu et al.)",
           "dpbench/trust/release_checks.py", '            _close(expected, entry["sensitivity"], f"privacy_ledger[{index}] '
           'sensitivity (Wu et al.)")', "            pass", first="tests/test_verify.py"),
    Mutant("verify-amp-sensitivity", "verify", "AMP's objective sensitivity is not checked against 2L/n",
           "dpbench/trust/release_checks.py", '            _close(2 * lipschitz / n, entry["sensitivity"], f"{what} sensitivity 2L/n")',
           "            pass", first="tests/test_verify.py"),
    Mutant("verify-unknown-release", "verify", "a ledger part verify cannot recompute is accepted",
           "dpbench/trust/release_checks.py", '            raise Mismatch(f"{what} is a release verify cannot recompute")',
           "            pass", first="tests/test_verify.py"),
    # issue 31: RDP under replace-one (shuffled batches), AMP's objective noise and its released fields
    Mutant("rdp-replace-one-sensitivity-1", "accounting", "shuffled batches under RDP accounted with sensitivity 1, "
           "as dp-accounting's RDP accountant reads a Gaussian under any relation (ε about half)",
           "dpbench/privacy/accounting.py",
           'return _doubled_sensitivity(event) if accountant == "rdp" and neighbouring == "replace-one" else event',
           "return event", first="tests/test_privacy.py"),
    Mutant("amp-b1-unchecked", "release", "AMP's objective noise b1 is not checked against its proof's tail bound "
           "(at ε = 40 on breast_cancer P[loss > ε3] = 4.0e-3 against δ1 = 4.8e-6)", "dpbench/release/mechanisms.py",
           "if tail > delta_objective * (1 + 1e-9):", "if tail > math.inf:",
           first="tests/test_amp.py"),
    Mutant("amp-publishes-iterations", "release", "AMP's record publishes its solver's iteration count "
           "(data-dependent, outside the theorem)", "dpbench/release/runner.py",
           "steps = None  # the solver's `iterations`", "steps = iterations  # the solver's `iterations`",
           first="tests/test_amp.py"),
    Mutant("tuning-old-coins-stored", "tuning", "records of the tuning whose K followed from its public seed count "
           "as stored runs of the fixed one (a sweep over an old store keeps them)", "dpbench/tuning/released.py",
           '"coins": "study secret", ', "", first="tests/test_sweep.py"),
    Mutant("tuning-failure-says-k", "tuning", "the refusal of a study whose every trial failed says how many ran",
           "dpbench/tuning/released.py", 'f"every trial of study {study.study_name} failed', 'f"all {k} trials of study '
           '{study.study_name} failed', first="tests/test_tuning.py"),
    Mutant("verify-k-distribution-unchecked", "verify", "a tuned record's charged K distribution may differ from "
           "its config's (a forged mean 1.0001 instead of 8 passed)", "dpbench/trust/record_checks.py",
           'for key in ("k_distribution", "trials"):', "for key in ():", first="tests/test_verify.py"),
    Mutant("verify-amp-epsilon-split", "verify", "AMP's objective parts are not checked against ε1 of ε/K (a record "
           "claiming 0.9 of it, same noise, passes the split)", "dpbench/trust/release_checks.py",
           'f"{what} epsilon (ε1 of ε/K)")', 'f"{what} epsilon (ε1 of ε/K)") if False else None',
           first="tests/test_verify.py"),
    Mutant("verify-classifiers-from-ledger", "verify", "a release method's classifiers are counted from its ledger, "
           "not from the task's classes (digits AMP or output perturbation without classifier 9 and with 9/10 of "
           "the ε passes)", "dpbench/trust/plan_checks.py", "    if parts != labels:", "    if False:",
           first="tests/test_verify.py"),
    Mutant("isolation-public-batches", "isolation", "an isolated run's batches come from the public seed, which the "
           "method can read", "dpbench/run/planning.py",
           "sampler_seed = streams.secret_seed() if spec.isolate and method.private else spec.seed",
           "sampler_seed = spec.seed",
           first="tests/test_isolation.py::test_an_isolated_runs_batches_are_not_the_public_seeds"),
    Mutant("isolation-loads-entry-points", "isolation", "installed packages' methods and tasks are imported into an "
           "isolated run's training process", "dpbench/run/planning.py",
           "registry.methods([], installed=False), registry.tasks([], installed=False)",
           "registry.methods([]), registry.tasks([])",
           first="tests/test_isolation.py::test_isolated_runs_never_load_installed_packages"),
    Mutant("verify-noise-coins-unchecked", "verify", "a record claiming secret noise coins without an isolated run "
           "escapes --rerun", "dpbench/trust/record_checks.py",
           'if record.get("kind", "run") == "run" and (coins not in (None, "secret") or (coins == "secret") != isolated):',
           'if False:', first="tests/test_verify.py::test_secret_noise_coins_must_go_with_an_isolated_run"),
    Mutant("verify-data-releases-from-record", "verify", "a record's data releases are taken as recorded, not "
           "from its task's options (mnist_mlp adaclip without its DP-PCA passes)", "dpbench/trust/plan_checks.py",
           "    if recorded != expected:", "    if False:", first="tests/test_verify.py"),
    Mutant("engine-undeclared-release", "accounting", "a task may release from its training data other than it "
           "declares (what verify recomputes)", "dpbench/run/planning.py",
           "    if [event_fields(release.event) for release in data.private_releases] != declared:", "    if False:",
           first="tests/test_verify.py"),
    Mutant("verify-amp-tail-unchecked", "verify", "an AMP record whose b1 fails the proof's tail bound passes",
           "dpbench/trust/release_checks.py", "> entry[\"delta\"] * (1 + TOLERANCE):", "> math.inf:", first="tests/test_verify.py"),
    Mutant("verify-rerun-ignores-code", "verify", "a rerun does not compare which code ran (a plugin record "
           "relabelled built-in passes)", "dpbench/trust/rerun.py", 'if k != "sha256"}', 'if k == "name"}',
           first="tests/test_verify.py"),
    Mutant("resume-rewound-noise", "checkpoints", "a resumed run takes its checkpoint's noise counter unchecked (a "
           "rewound counter repeats earlier releases' noise)", "dpbench/run/checkpoint.py",
           'if noise_state["counter"] != drawn:', "if False:", first="tests/test_resume.py"),
    Mutant("resume-edited-band", "checkpoints", "a resumed run takes its checkpoint's band (banded noise) or tree "
           "node noises unchecked (an edited band changes every later release's noise)", "dpbench/run/checkpoint.py",
           "        check_correlated_values(module)\n", "", first="tests/test_resume.py"),
    Mutant("isolation-trusts-module-name", "isolation", "an isolated plugin naming its module dpbench.methods.x is "
           "recorded as a built-in method", "dpbench/run/isolation.py", '"external": True,',
           '"external": not facts["file"].endswith("sneaky.py"),', first="tests/test_isolation.py"),
    # issue 31: the privacy cache
    Mutant("cache-outlives-code", "accounting", "the privacy cache's key no longer covers the accounting code, so a "
           "fixed ε is still served from values the old code stored", "dpbench/privacy/cache.py",
           'return f"{source.hexdigest()}:{importlib.metadata.version(\'dp-accounting\')}"',
           'return f"{importlib.metadata.version(\'dp-accounting\')}"', first="tests/test_cache.py"),
    # issue 31: AdaCliP's clipped sum and the batched runs' refusals
    Mutant("adaclip-sum-float32", "clipping", "AdaCliP's closed-form clipped sum accumulated in float32 again",
           "dpbench/privacy/affine.py", "a64, weighted = a.double(), g.double() * factors.double().unsqueeze(-1)",
           "a64, weighted = a, g * factors.unsqueeze(-1)",
           first="tests/test_ghost.py"),
    Mutant("adaclip-sum-unbounded", "clipping", "the rounding bound of AdaCliP's closed-form sum ignored (never "
           "materialized)", "dpbench/privacy/affine.py", "for run in (error_norms > SUM_TOLERANCE * largest).nonzero()",
           "for run in (error_norms < 0).nonzero()", first="tests/test_ghost.py"),
    Mutant("multiseed-release-method", "batched seeds", "a method that releases through dpbench.release.mechanisms.mechanisms is batched",
           "dpbench/run/multiseed.py",
           "    if issubclass(planning.registered(first.method, first.task, first.plugins)[0], ReleaseMethod):\n",
           "    if False:\n", first="tests/test_multiseed.py"),
    Mutant("multiseed-reference-clipping", "batched seeds", "a run asking for the reference clipping is batched",
           "dpbench/run/multiseed.py", '    if any(spec.clipping != "fast" for spec in specs):\n', "    if False:\n",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-other-method", "batched seeds", "runs of different methods or tasks are batched",
           "dpbench/run/multiseed.py",
           "    if len({(spec.method, spec.task, tuple(spec.plugins)) for spec in specs}) > 1:\n", "    if False:\n",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-other-model", "batched seeds", "runs whose models differ (with and without bias) are batched",
           "dpbench/run/multiseed.py",
           "    if len({tuple(p.shape for p in module.params()) for module in modules}) > 1:",
           "    if False:", first="tests/test_multiseed.py"),
    Mutant("multiseed-other-labels", "batched seeds", "runs whose training labels differ are batched (only the "
           "inputs compared)", "dpbench/run/multiseed.py",
           "((run.data.x_train, data.x_train), (run.data.y_train, data.y_train)))",
           "((run.data.x_train, data.x_train),))", first="tests/test_multiseed.py"),
    Mutant("multiseed-other-data", "batched seeds", "runs whose training data differ are batched",
           "dpbench/run/multiseed.py", "    if any(run.data_releases or not same_data(run) for run in planned):",
           "    if any(run.data_releases for run in planned):", first="tests/test_multiseed.py"),
    Mutant("multiseed-nonlinear", "batched seeds", "a model other than one linear layer is batched",
           "dpbench/run/multiseed.py", "    if not isinstance(module.task.model, nn.Linear):\n", "    if False:\n",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-augmentation", "batched seeds", "a task with data augmentation is batched",
           "dpbench/run/multiseed.py", "    if type(module.task).augment is not Task.augment:\n", "    if False:\n",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-transform", "batched seeds", "a per-example transform that is not coordinate-wise affine is "
           "batched", "dpbench/run/multiseed.py",
           "    if transform is not None and not isinstance(transform, CoordinateAffine):\n", "    if False:\n",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-sparse", "batched seeds", "sparse inputs are batched", "dpbench/run/multiseed.py",
           "    if module.task.data.x_train.is_sparse:\n", "    if False:\n", first="tests/test_multiseed.py"),
    Mutant("multiseed-transform-changed", "batched seeds", "a step is batched after a run's transform became other "
           "than coordinate-wise affine", "dpbench/run/multiseed.py",
           "    if any(t is not None and not isinstance(t, CoordinateAffine) for t in transforms):\n", "    if False:\n",
           first="tests/test_multiseed.py"),
    Mutant("multiseed-mixed-transforms", "batched seeds", "a step is batched where some runs transform their "
           "examples' gradients and some do not", "dpbench/run/multiseed.py",
           "    if any((t is not None) != affine for t in transforms):\n", "    if False:\n",
           first="tests/test_multiseed.py"),
    # issue 31, item 3: the open attacks on --isolate (the noise's key, the child's view, the code hash, the transform)
    Mutant("isolation-noise-seed-key", "isolation", "an isolated run's noise is keyed by the public seed again (a "
           "method reading the seed from the command line subtracts it)", "dpbench/run/training.py",
           "self.noise_seed = streams.secret_seed() if isolate and method.private else seed",
           "self.noise_seed = seed",
           first="tests/test_isolation.py::test_isolated_noise_has_a_secret_key_written_nowhere"),
    Mutant("isolation-record-no-noise-coins", "isolation", "an isolated run's record does not say its noise coins "
           "are secret", "dpbench/run/planning.py",
           '**({"noise_coins": "secret", "sampler_coins": "secret"} if spec.isolate and method.private else {}),',
           '**({"sampler_coins": "secret"} if spec.isolate and method.private else {}),', first="tests/test_isolation.py::test_isolated_noise_has_a_secret_key_written_nowhere"),
    Mutant("isolation-keeps-checkpoints", "isolation", "--isolate with checkpoints is not refused (a checkpoint "
           "would hold the noise's key)", "dpbench/run/refusals.py",
           '    if spec.checkpoint_dir or spec.resume:\n        raise UsageError("--isolate keeps no checkpoints',
           '    if False:\n        raise UsageError("--isolate keeps no checkpoints',
           first="tests/test_isolation.py::test_isolate_refuses_what_would_need_the_noise_key"),
    Mutant("verify-reruns-secret-noise", "verify", "--rerun compares the metrics of a record whose noise coins were "
           "secret (no rerun can reproduce them)", "dpbench/trust/rerun.py",
           '    candidates = [r for r in runs if _seeded(r) and r.get("noise_coins") != "secret"]',
           "    candidates = [r for r in runs if _seeded(r)]",
           first="tests/test_verify.py::test_secret_noise_coins_are_checked_but_not_rerun"),
    Mutant("isolation-child-argv", "isolation", "an isolated process gets the parent's sys.argv (the seed)",
           "dpbench/run/isolation.py", "    sys.argv = sys.argv[:1]\n", "",
           first="tests/test_isolation.py::test_an_isolated_process_sees_no_seed_and_cannot_open_the_parents_memory"),
    Mutant("isolation-child-environment", "isolation", "an isolated process gets the parent's whole environment",
           "dpbench/run/isolation.py", "            del os.environ[key]", "            pass",
           first="tests/test_isolation.py::test_an_isolated_process_sees_no_seed_and_cannot_open_the_parents_memory"),
    Mutant("isolation-dumpable", "isolation", "the training process stays dumpable: an isolated process of the same "
           "user opens its /proc/<pid>/mem", "dpbench/run/isolation.py",
           '    if sys.platform.startswith("linux"):\n        libc', "    if False:\n        libc",
           first="tests/test_isolation.py::test_an_isolated_process_sees_no_seed_and_cannot_open_the_parents_memory"),
    Mutant("isolation-foreign-file", "isolation", "an isolated method may name a file outside its plugin folders as "
           "its class's", "dpbench/run/isolation.py", '    if facts["file"] not in files:\n', "    if False:\n",
           first="tests/test_isolation.py::test_the_parent_hashes_the_plugin_folder_itself"),
    Mutant("isolation-hash-named-file", "isolation", "an isolated method's code hash covers only the file its process "
           "names, not its plugin folders", "dpbench/run/isolation.py", "    hashed = {**files, **{path:",
           '    hashed = {facts["file"]: files[facts["file"]], **{path:',
           first="tests/test_isolation.py::test_the_parent_hashes_the_plugin_folder_itself"),
    Mutant("code-in-process-class-file", "isolation", "an in-process plugin's code hash covers its class's file, not "
           "its folder (its isolated runs get another hash)", "dpbench/results/records.py",
           "        if klass.__module__.startswith(PLUGIN_MODULES):\n            files.update(plugin_files([Path(path)"
           ".parent]))\n        else:\n            files[path] = file_sha256(path)",
           "        files[path] = file_sha256(path)",
           first="tests/test_isolation.py::test_the_evader_cheats_in_process_and_only_runs_dp_sgd_isolated"),
    Mutant("isolation-transform-unchecked", "isolation", "an isolated method's per-example transform is used "
           "unchecked", "dpbench/run/isolation.py", "            transform.check()\n", "            pass\n",
           first="tests/test_isolation.py::test_an_isolated_transform_that_is_not_finite_and_positive_is_refused"),
    Mutant("affine-scale-sign", "isolation", "a zero or negative scale of a CoordinateAffine passes its check",
           "dpbench/privacy/clipping.py", "        if not all(bool((t > 0).all()) for t in self.scale):", "        if False:",
           first="tests/test_isolation.py::test_an_isolated_transform_that_is_not_finite_and_positive_is_refused"),
    Mutant("affine-finite", "isolation", "an infinite or NaN shift or scale of a CoordinateAffine passes its check",
           "dpbench/privacy/clipping.py",
           "        if not all(bool(t.isfinite().all()) for t in [*self.shift, *self.scale]):", "        if False:",
           first="tests/test_isolation.py::test_an_isolated_transform_that_is_not_finite_and_positive_is_refused"),
    Mutant("nonfinite-factor", "clipping", "an example whose norm is not finite keeps its clip factor (NaN: the "
           "release is NaN, a noise-free membership bit)", "dpbench/privacy/clipping.py",
           "    return torch.where(norms.isfinite() & factors.isfinite(), factors, 0.0)", "    return factors",
           first="tests/test_nonfinite.py"),
    Mutant("nonfinite-vmap-rows", "clipping", "the reference clipper multiplies a dropped example's non-finite "
           "gradient by its factor 0 (NaN)", "dpbench/privacy/clipping.py",
           "        grads = zero_rows(grads, norms.isfinite())\n", "",
           first="tests/test_nonfinite.py"),
    Mutant("nonfinite-ghost-rows", "clipping", "the fast clipper leaves a dropped example's non-finite rows in the "
           "sum (factor 0 times inf: NaN)", "dpbench/privacy/ghost.py", "            if not bool(kept.all()):",
           "            if False:", first="tests/test_nonfinite.py"),
    Mutant("nonfinite-batched", "clipping", "the batched closed form keeps a pair whose gradient is not finite",
           "dpbench/run/multiseed.py",
           "    kept, (output_grads,) = keep_finite([output_grads], len(output_grads))",
           "    kept = torch.ones(len(output_grads), dtype=torch.bool)", first="tests/test_nonfinite.py"),
    Mutant("nonfinite-batched-factor", "clipping", "the batched closed form zeroes a dropped pair's gradient but not "
           "its factor", "dpbench/run/multiseed.py",
           "    factors = torch.where(kept, clip_factors(", "    factors = (lambda f: f)(clip_factors(",
           first="tests/test_nonfinite.py"),
    Mutant("plugin-bytecode", "isolation", "plugin files are imported through Python's import system, which runs a "
           "__pycache__ file in place of the hashed source", "dpbench/registry.py",
           'exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)',
           "importlib.util.spec_from_file_location(name, path).loader.exec_module(module)",
           first="tests/test_isolation.py::test_plugins_run_their_hashed_source_never_cached_bytecode"),
    Mutant("isolation-unpinned", "isolation", "the isolated process reads the plugin files again after the parent "
           "hashed them", "dpbench/run/isolation.py", "        registry.pin_sources(sources)\n        method_class",
           "        method_class", first="tests/test_isolation.py::test_an_isolated_process_runs_the_bytes_the_parent_hashed"),
    Mutant("audit-key-isolation", "audit", "a pass of a plugin in process marks its isolated runs (and the reverse)",
           "dpbench/trust/audit.py",
           'key = (code, task, record.get("isolation") or "in-process")',
           'key = (code, task, "in-process")',
           first="tests/test_audit.py::test_audit_status_and_the_board_mark"),
    Mutant("audit-canaries-public", "audit", "an isolated audit draws its canaries from the public seed",
           "dpbench/trust/audit.py", "streams.secret_seed() if spec.isolate else spec.seed", "spec.seed",
           first="tests/test_audit.py::test_an_isolated_audit_draws_its_canaries_from_a_secret"),
    Mutant("ghost-exact-linear", "clipping", "an isolated method's sequence Linear takes the ghost norm, which its "
           "parameters can cancel to 0", "dpbench/privacy/ghost.py",
           "if steps * steps <= p * q and not self.exact:  # ghost norm", "if steps * steps <= p * q:  # ghost norm",
           first="tests/test_ghost.py::test_exact_norms_cannot_be_cancelled_by_the_parameters"),
    Mutant("ghost-exact-conv", "clipping", "an isolated method's Conv2d takes the ghost norm", "dpbench/privacy/ghost.py",
           "layer.out_channels and not self.exact  # T² ≤ p·q", "layer.out_channels  # T² ≤ p·q",
           first="tests/test_ghost.py::test_exact_norms_cannot_be_cancelled_by_the_parameters"),
    Mutant("ghost-exact-embedding", "clipping", "an isolated method's Embedding takes the ghost norm",
           "dpbench/privacy/ghost.py", " and not module.sparse and not exact:", " and not module.sparse:",
           first="tests/test_ghost.py::test_exact_norms_cannot_be_cancelled_by_the_parameters"),
    Mutant("isolated-not-exact", "isolation", "an isolated run clips with the cancellable ghost norms",
           "dpbench/run/training.py", "exact=isolate or self.gamma is not None)",
           "exact=self.gamma is not None)",
           first="tests/test_isolation.py::test_built_in_methods_compute_the_same_isolated"),
    Mutant("ghost-sum-into-noise", "clipping", "the fast clipper adds its per-token terms into the noise one by one "
           "(they can round the noise away)", "dpbench/privacy/ghost.py",
           "own = sums if into is None or affine is not None else", "own = sums if True else",
           first="tests/test_ghost.py::test_the_clipped_sum_is_added_to_the_noise_once"),
    Mutant("conv-off-patch", "clipping", "a convolution input that is not finite where no patch reads it keeps its "
           "example", "dpbench/privacy/ghost.py",
           'sq_norms = sq_norms + torch.where(x.flatten(1).isfinite().all(1), 0.0, float("nan"))',
           "sq_norms = sq_norms + 0", first="tests/test_nonfinite.py"),
    Mutant("audit-isolated-public-coins", "audit", "an isolated audit with canaries from the public seed counts",
           "dpbench/trust/audit.py",
           'and (record.get("isolation") != "process" or record.get("canary_coins") == "secret"))', "and True)",
           first="tests/test_audit.py::test_audit_status_and_the_board_mark"),
    Mutant("pinned-siblings", "isolation", "an isolated plugin's sibling imports load from the disk (bytecode "
           "included), not from the hashed bytes", "dpbench/registry.py",
           "    sys.meta_path.insert(0, _PinnedFinder({Path(path).parent for path in _PINNED}))", "",
           first="tests/test_isolation.py::test_an_isolated_plugin_imports_nothing_from_its_folder_but_the_hashed_files"),
    Mutant("autoclip-not-exact", "clipping", "automatic clipping trains with the float32 ghost norms, which can cancel "
           "to 0 (C/(0 + γ) then scales the true gradient)", "dpbench/run/training.py",
           "exact=isolate or self.gamma is not None)", "exact=isolate)",
           first="tests/test_adaptive_clipping.py::test_automatic_scaling_uses_norms_that_cannot_cancel"),
    Mutant("gamma-floor", "clipping", "automatic clipping accepts any positive γ (1e-30: 1.7e6·C)",
           "dpbench/privacy/clipping.py", "or gamma < MIN_GAMMA:", "or gamma <= 0:",
           first="tests/test_adaptive_clipping.py::test_a_gamma_below_the_floor_is_refused"),
    Mutant("count-off-grid", "count release", "the count release is the exact float64 sum of a half-integer and a "
           "float32 noise value", "dpbench/run/training.py",
           "round((below + noise) / COUNT_GRID) * COUNT_GRID", "below + noise",
           first="tests/test_adaptive_clipping.py::test_the_count_release_leaves_no_float_trace_of_the_count"),
    Mutant("verify-external-builtin", "verify", "verify trusts a record's 'external' flag for a method named like a "
           "built-in", "dpbench/trust/plan_checks.py", '    return _builtin_methods().get(record["method"])',
           '    return None if ((record.get("code") or {}).get("method") or {}).get("external", True) else '
           '_builtin_methods().get(record["method"])',
           first="tests/test_adaptive_clipping.py::test_a_plugin_records_extra_releases_are_charged_by_verify"),
    Mutant("nonfinite-data", "clipping", "training features that are not finite are accepted (the batched closed "
           "form does not zero a data row)", "dpbench/data/taskdata.py",
           "x.layout == torch.strided and not bool(x.isfinite().all()):", "False:",
           first="tests/test_nonfinite.py"),
    # issue 34: the engine's automatic scaling, moving clip norm and count release (quantile_clip, autoclip)
    Mutant("count-noise-missing", "count release", "the count release gets no noise (a noise-free count of the "
           "batch's examples below C_t)", "dpbench/run/training.py",
           "noise = float(self.noise.fill_(torch.empty(1), std)[0]) if std else 0.0", "noise = 0.0",
           first="tests/test_adaptive_clipping.py::test_count_noise_has_standard_deviation_sigma_b_and_mean_zero"),
    Mutant("count-noise-half", "count release", "the count's noise has standard deviation σ_b/2",
           "dpbench/run/training.py", "noise = float(self.noise.fill_(torch.empty(1), std)[0]) if std else 0.0",
           "noise = float(self.noise.fill_(torch.empty(1), std / 2)[0]) if std else 0.0",
           first="tests/test_adaptive_clipping.py::test_count_noise_has_standard_deviation_sigma_b_and_mean_zero"),
    Mutant("clip-update-private", "count release", "the noise is drawn but the method's clip update gets the exact "
           "count (its next C_t is a function of non-public data)", "dpbench/run/training.py",
           "round((below + noise) / COUNT_GRID) * COUNT_GRID",
           "round(below / COUNT_GRID) * COUNT_GRID",
           first="tests/test_adaptive_clipping.py::test_count_noise_has_standard_deviation_sigma_b_and_mean_zero"),
    Mutant("count-not-charged", "count release", "the ledger charges the gradient's σ alone, not the pair's "
           "combined noise multiplier", "dpbench/run/planning.py",
           'return combined_noise_multiplier(record["noise_multiplier"], extra) if extra else record["noise_multiplier"]',
           'return record["noise_multiplier"]',
           first="tests/test_adaptive_clipping.py::test_a_quantile_clip_record_charges_the_count_and_verify_recomputes_it"),
    Mutant("count-not-calibrated", "count release", "σ is calibrated as if the count were free (the gradient runs "
           "at the pair's combined z)", "dpbench/run/planning.py",
           "sigma, extra = _count_calibrated(combined, count_extra)",
           "sigma, extra = combined, count_extra(combined)",
           first="tests/test_adaptive_clipping.py::test_a_quantile_clip_record_charges_the_count_and_verify_recomputes_it"),
    Mutant("count-drawn-without-sigma", "count release", "the run draws the count's noise at B/20 (σ_b computed "
           "without the gradient's σ) while its record and ε charge max(B/20, 5σ)", "dpbench/run/planning.py",
           'count = (self.record.get("extra_releases") or [{}])[0].get("noise_std")',
           'count = self.method.count_noise_std(self.hp, self.record["sample_rate"] * self.data.n_train) '
           'if self.method.private and self.method.count_release else None',
           first="tests/test_adaptive_clipping.py::test_the_count_noise_drawn_is_the_records"),
    Mutant("combined-drops-count", "count release", "the combined noise multiplier leaves the count out",
           "dpbench/privacy/accounting.py",
           "return (noise_multiplier**-2 + math.fsum((s / std) ** 2 for s, std in extra)) ** -0.5",
           "return noise_multiplier", first="tests/test_adaptive_clipping.py::test_combined_noise_multiplier_is_andrew_et_al_theorem_1"),
    Mutant("count-sensitivity-quarter", "count release", "the centred count charged at sensitivity ¼ instead of ½",
           "dpbench/privacy/accounting.py", "COUNT_SENSITIVITY = 0.5", "COUNT_SENSITIVITY = 0.25",
           first="tests/test_adaptive_clipping.py::test_a_quantile_clip_record_charges_the_count_and_verify_recomputes_it"),
    Mutant("verify-count-optional", "verify", "verify accepts a built-in count method's record that lists no count "
           "(recomputing ε from the gradient's σ alone)", "dpbench/trust/plan_checks.py",
           '        if len(extra) != 1 or extra[0].get("sensitivity") != 0.5:', "        if False:",
           first="tests/test_adaptive_clipping.py::test_a_quantile_clip_record_charges_the_count_and_verify_recomputes_it"),
    Mutant("autoclip-exceeds-c", "clipping", "automatic clipping scales by C/(‖g‖/2 + γ): contributions up to 2C",
           "dpbench/privacy/clipping.py", "factors = (max_norm * scale) / (norms + check_gamma(gamma))",
           "factors = (max_norm * scale) / (0.5 * norms + check_gamma(gamma))",
           first="tests/test_adaptive_clipping.py::test_no_example_contributes_more_than_c_under_automatic_scaling"),
    Mutant("moving-clip-noise-at-c0", "clipping", "a moving clip norm's releases get the noise of the initial C_0",
           "dpbench/run/training.py",
           "mechanism = self.mechanism if clip is None else replace(self.mechanism, clip=clip)",
           "mechanism = self.mechanism",
           first="tests/test_adaptive_clipping.py::test_quantile_clip_equals_the_transcription_step_for_step"),
    Mutant("moving-clip-unchecked", "clipping", "a clip norm that is not finite and positive is used",
           "dpbench/run/training.py",
           "        if isinstance(clip, bool) or not isinstance(clip, (int, float)) or not MIN_CLIP <= clip <= MAX_CLIP:",
           "        if False:", first="tests/test_adaptive_clipping.py::test_a_clip_norm_that_is_not_finite_and_positive_is_refused"),
    Mutant("count-trial-gradient-at-z", "tuning", "a count method's trial draws its gradient at the tuning's σ and "
           "the count on top (less noise than the trial's Gaussian is charged at)", "dpbench/tuning/trials.py",
           "noise_multiplier=plan_.trial.noise_multiplier, noise_is_combined=True,",
           "noise_multiplier=plan_.trial.noise_multiplier, noise_is_combined=False,",
           first="tests/test_tuning.py::test_a_count_methods_trials_draw_the_combined_noise_the_tuning_charges"),
    Mutant("trial-noise-unchecked", "tuning", "a trial that drew less noise than the tuning charges is not refused",
           "dpbench/tuning/trials.py", "        if not trial.noise_multiplier <= charged <= trial.noise_multiplier",
           "        if False and trial.noise_multiplier <= charged <= trial.noise_multiplier",
           first="tests/test_tuning.py::test_a_count_methods_trials_draw_the_combined_noise_the_tuning_charges"),
    Mutant("tuned-count-uncharged-in-verify", "verify", "verify compares the tuning's σ with the gradient's alone, "
           "not with the gradient and its count combined", "dpbench/trust/record_checks.py",
           "        charged = _charged_sigma(record)\n",
           "        charged = _charged_sigma(record) and record[\"noise_multiplier\"]\n",
           first="tests/test_verify.py::test_a_tuned_count_method_is_charged_at_the_pair_it_drew"),
    Mutant("tuned-correlated-as-poisson", "tuning", "a correlated-noise trial is charged as Poisson-subsampled "
           "independent noise at q = B/n (amplification its fixed cyclic batches do not give)",
           "dpbench/tuning/accounting.py", "        if self.sampler == correlated.SAMPLER:\n",
           "        if False:\n", first="tests/test_tuning.py::test_correlated_noise_is_tuned_with_its_own_mechanism"),
    Mutant("tuned-correlation-unchecked-in-verify", "verify", "verify takes a tuned bandmf or dpftrl record that says "
           "its trials were Poisson-subsampled independent noise", "dpbench/trust/record_checks.py",
           "    if method is not None and (method.correlation(hp) is not None) != cyclic:",
           "    if False:", first="tests/test_tuning.py::test_correlated_noise_is_tuned_with_its_own_mechanism"),
    Mutant("adaptive-isolated", "isolation", "a method with a count release or moving C runs isolated (the child "
           "never forwards them)", "dpbench/run/refusals.py",
           '("--isolate (the isolated process does not forward them)", spec.isolate)',
           '("--isolate (the isolated process does not forward them)", False)', first="tests/test_adaptive_clipping.py::test_refusals"),
    Mutant("banded-sign", "correlated noise", "the band's forward substitution adds c_j·w_(t−j) instead of subtracting "
           "it (the noise of another strategy than the C accounted)", "dpbench/privacy/correlated.py",
           "tensor.sub_(old, alpha=self.coefficients[j])", "tensor.add_(old, alpha=self.coefficients[j])",
           first="tests/test_correlated.py::test_banded_noise_is_c_inverse_z"),
    Mutant("banded-short-band", "correlated noise", "the band keeps b − 2 noise vectors instead of b − 1",
           "dpbench/privacy/correlated.py", "*self.history][: self.bands - 1]", "*self.history][: self.bands - 2]",
           first="tests/test_correlated.py::test_banded_noise_is_c_inverse_z"),
    Mutant("banded-one-participation", "correlated noise", "the sensitivity leaves out √k (one participation charged "
           "for k epochs)", "dpbench/privacy/correlated.py", "return math.sqrt(participations) * column_norm(bands)",
           "return column_norm(bands)", first="tests/test_correlated.py::test_epsilon_is_the_analytic_gaussian_of_the_sensitivity"),
    Mutant("banded-column-norm-one", "correlated noise", "the strategy's column norm taken as 1 (charged as "
           "independent noise)", "dpbench/privacy/correlated.py",
           "return math.sqrt(math.fsum(c * c for c in coefficients(bands)))", "return 1.0",
           first="tests/test_correlated.py::test_coefficients_are_the_square_root_of_the_prefix_sum_matrix"),
    Mutant("banded-charged-as-one-band", "correlated noise", "the engine calibrates and charges b = 1 whatever the "
           "method's bands", "dpbench/run/planning.py",
           'return getattr(correlation, "bands", 0), isinstance(correlation, correlated.Tree)',
           'return min(1, getattr(correlation, "bands", 0)), isinstance(correlation, correlated.Tree)',
           first="tests/test_correlated.py::test_a_bandmf_record_is_charged_and_verify_recomputes_it"),
    Mutant("cyclic-separation-unchecked", "correlated noise", "fewer batches per epoch than bands are accepted "
           "(participations closer than b: overlapping columns)", "dpbench/privacy/correlated.py",
           "    if batches < bands:", "    if False:", first="tests/test_correlated.py::test_refusals"),
    Mutant("cyclic-fresh-partition", "correlated noise", "the cyclic sampler draws a new partition every epoch "
           "(an example's participations can be 1 step apart across epochs)", "dpbench/privacy/sampling.py",
           "order = torch.randperm(self.n, generator=_generator(self.seed, 0))",
           "order = torch.randperm(self.n, generator=_generator(self.seed, self.epoch))",
           first="tests/test_correlated.py::test_the_cyclic_sampler_visits_one_partition_in_the_same_order_every_epoch"),
    Mutant("cyclic-add-remove", "correlated noise", "banded noise on fixed-size batches accepted under add/remove",
           "dpbench/privacy/accounting.py", '    if sampler == "cyclic" and neighbouring != "replace-one":',
           "    if False:", first="tests/test_correlated.py::test_the_cyclic_sampler_and_banded_noise_go_together_under_replace_one_only"),
    Mutant("correlation-searched", "tuning", "a search space that changes a method's noise correlation (bandmf's "
           "bands) is tuned privately: each trial its own mechanism, the total charging one",
           "dpbench/tuning/plan.py", "            if other != correlation:", "            if False:",
           first="tests/test_tuning.py::test_correlated_noise_tuning_refuses_what_would_change_the_trials_mechanism"),
    Mutant("banded-band-not-checked", "checkpoints", "a checkpoint's band of noise vectors is resumed unchecked",
           "dpbench/run/checkpoint.py",
           '        if kept != min(bands - 1, implied["releases"]) or band.get("bands") != bands:', "        if False:",
           first="tests/test_correlated.py::test_a_checkpoint_with_an_emptied_band_is_refused"),
    Mutant("verify-banded-sensitivity-from-record", "verify", "verify takes a banded record's sensitivity from the "
           "record", "dpbench/trust/plan_checks.py",
           "return dp_accounting.GaussianDpEvent(sigma / _banded_sensitivity(record))",
           'return dp_accounting.GaussianDpEvent(sigma / record["noise_correlation"]["sensitivity"])',
           first="tests/test_correlated.py::test_a_bandmf_record_is_charged_and_verify_recomputes_it"),
    Mutant("verify-banded-bands-unchecked", "verify", "verify accepts a built-in bandmf record whose bands are not "
           "its hyperparameters' (a consistent forgery with fewer bands)", "dpbench/trust/plan_checks.py",
           '        if getattr(declared, "bands", None) != bands:', "        if False:",
           first="tests/test_correlated.py::test_a_bandmf_record_is_charged_and_verify_recomputes_it"),
    Mutant("tree-retired-added", "correlated noise", "the tree's step noise adds the retired nodes' noises instead of "
           "subtracting them (the prefix sums are not the tree's)", "dpbench/privacy/correlated.py",
           "tensor.sub_(old)", "tensor.add_(old)",
           first="tests/test_correlated.py::test_tree_noise_sums_to_the_dyadic_prefix_noise_and_restarts_every_epoch"),
    Mutant("tree-replace-one-as-special", "correlated noise", "the tree under replace-one charged at sensitivity C "
           "(dp-accounting's replace-special) instead of 2C", "dpbench/privacy/accounting.py",
           "return dp_accounting.SingleEpochTreeAggregationDpEvent(event.noise_multiplier / 2, event.step_counts)",
           "return event", first="tests/test_correlated.py::test_tree_epsilon_is_the_rdp_of_a_gaussian_per_node_path"),
    Mutant("verify-tree-depth-one", "verify", "verify charges a tree of one step per epoch (depth 1)",
           "dpbench/trust/plan_checks.py", "SingleEpochTreeAggregationDpEvent(sigma, batches), epochs)",
           "SingleEpochTreeAggregationDpEvent(sigma, 1), epochs)",
           first="tests/test_correlated.py::test_a_dpftrl_record_is_charged_and_verify_recomputes_it"),
    Mutant("correlated-skip-shifts-band", "correlated noise", "a step whose release the method skipped draws no "
           "noise, shifting every later row of C (participations closer than b rows; hostile review)",
           "dpbench/run/training.py", "        if self.correlated is not None and next(pending, None) is not None:",
           "        if False:",
           first="tests/test_correlated.py::test_a_step_without_a_release_still_advances_the_correlated_noise"),
    Mutant("correlated-draw-check-off", "correlated noise", "the end of a correlated run does not check one noise draw "
           "per charged release", "dpbench/run/training.py",
           '        if state["counter"] != self.releases * per_release:', "        if False:",
           first="tests/test_correlated.py::test_the_end_of_a_correlated_run_refuses_releases_without_their_draws"),
    Mutant("verify-reference-any-config", "verify", "verify accepts a reference of another l2 grid or split (one of "
           "several, kept for its test accuracy)", "dpbench/trust/record_checks.py", "    if differing:\n        raise Mismatch(f\"the reference's",
           "    if False:\n        raise Mismatch(f\"the reference's",
           first="tests/test_reference.py::test_verify_checks_a_references_selection_and_reruns_its_solve"),
    Mutant("correlated-torch-noise", "correlated noise", "correlated noise accepted from PyTorch's generator, whose "
           "draws the run's end cannot count", "dpbench/run/refusals.py", 'f"and on resume)": spec.noise != "fast",',
           'f"and on resume)": False,', first="tests/test_correlated.py::test_refusals"),
    Mutant("correlated-uncheckable-passes", "correlated noise", "the end of a correlated run passes when the noise "
           "stream has no counter", "dpbench/run/training.py",
           '        if "counter" not in state:  # PyTorch\'s generator', '        if False:  # PyTorch\'s generator',
           first="tests/test_correlated.py::test_correlated_noise_from_an_uncheckable_stream_fails_at_the_end"),
    Mutant("correlated-with-moving-clip", "correlated noise", "correlated noise accepted with a moving clip norm, a "
           "count release or automatic scaling (the strategy becomes D⁻¹C)", "dpbench/run/refusals.py",
           '" and ".join(adaptive_features(method)) or "adaptive clipping": bool(adaptive_features(method)),',
           '" and ".join(adaptive_features(method)) or "adaptive clipping": False,',
           first="tests/test_correlated.py::test_correlated_noise_with_adaptive_clipping_is_refused"),
    Mutant("verify-cyclic-two-releases", "verify", "verify accepts a cyclic record of two releases per step",
           "dpbench/trust/plan_checks.py", '        if sampler == "cyclic" and k != 1:', "        if False:",
           first="tests/test_correlated.py::test_verify_refuses_a_cyclic_record_of_two_releases_per_step"),
    Mutant("multiseed-moving-clip-noise-at-c0", "batched seeds", "batched runs of a method that moves its clip norm "
           "clip at C_t but add the noise of C_0 (under-noised wherever C_t > C_0)", "dpbench/run/multiseed.py",
           "own = module.fill_noise([noise[index] for noise in noisy], moved[index] if moving else None)",
           "own = module.fill_noise([noise[index] for noise in noisy], None)",
           first="tests/test_multiseed.py::test_consecutive_batched_releases_are_the_engines"),
    Mutant("multiseed-correlated-not-formed", "batched seeds", "batched runs with banded or tree noise add the "
           "independent draw z_t instead of the strategy's w_t", "dpbench/run/multiseed.py",
           "            module.correlated.apply_(own, positions[index])", "            pass",
           first="tests/test_multiseed.py::test_consecutive_batched_releases_are_the_engines"),
    Mutant("multiseed-skipped-correlated", "batched seeds", "a batched step whose release the method skipped draws no "
           "correlated noise (every later release's noise shifted by one row of C)", "dpbench/run/multiseed.py",
           "for i in skipped if correlated else ():", "for i in ():",
           first="tests/test_multiseed.py::test_a_skipped_release_forms_its_correlated_noise_in_a_batch_as_alone"),
    Mutant("kill-fails-trial", "tuning", "a trial whose worker died fails instead of running again: a stop's "
           "timing, which depends on K, decides which studies release (and all-killed ones never do)",
           "dpbench/tuning/claims.py", "if connection.execute(_TRIALS.update().where(*condition).values(state=TrialState.WAITING))",
           "if connection.execute(_TRIALS.update().where(*condition).values(state=TrialState.FAIL))",
           first="tests/test_requeue.py"),
    Mutant("requeue-unbounded", "tuning", "a trial that kills its worker every time is put back forever: the study "
           "never releases, an outcome that may depend on the data", "dpbench/tuning/claims.py",
           "if deaths > REQUEUE_LIMIT:", "if False:", first="tests/test_requeue.py"),
    Mutant("requeue-live", "tuning", "a trial that beat again (or was claimed again) after Optuna listed it as stale "
           "is put back and runs twice at once", "dpbench/tuning/claims.py", "        if stale:\n",
           "        if False:\n", first="tests/test_requeue.py"),
    Mutant("claim-stale-beat", "tuning", "a trial is claimed with the heartbeat of its study's creation, so another "
           "worker takes it for dead and counts a death it never had", "dpbench/tuning/claims.py",
           "        _beat(connection, trial_id)\n", "", first="tests/test_requeue.py"),
    Mutant("batch-death-counted", "tuning", "a death in a batch counts against each trial: three stops during one long "
           "job fail all its trials, so a stop's timing (K) decides the study", "dpbench/tuning/claims.py",
           "+ (stale and not attrs.get(_BATCHED, False))", "+ stale", first="tests/test_requeue.py"),
    Mutant("claim-read-then-write", "tuning", "a claim reads the trial's state, then writes RUNNING: two workers "
           "that listed the same WAITING trial both take it (SQLite has no row locks), and it runs twice at once",
           "dpbench/tuning/claims.py", "        if connection.execute(_TRIALS.update().where(*condition)\n",
           "        if connection.execute(sqlalchemy.select(_TRIALS.c.state).where(*condition)).first() is None or "
           "connection.execute(_TRIALS.update().where(_TRIALS.c.trial_id == trial_id)\n",
           first="tests/test_requeue.py::test_processes_claiming_at_once_never_take_the_same_trial"),
    Mutant("batch-claims-alone", "tuning", "a trial that died in a batch is claimed into the next batch, where its "
           "deaths are never counted: a trial that kills its worker blocks the study forever", "dpbench/tuning/claims.py",
           "        condition.append(~_has(trial_id, _ALONE, True))", "        pass", first="tests/test_requeue.py"),
    Mutant("put-back-foreign", "tuning", "an interrupted worker puts back claims it no longer holds (another run's "
           "live trial), which then runs twice", "dpbench/tuning/claims.py",
           "            condition.append(_has(trial_id, _CLAIM, token))", "            pass",
           first="tests/test_requeue.py"),
    Mutant("interrupt-fails-trial", "tuning", "an interrupted trial is told FAIL, so a Ctrl-C decides the study's K "
           "trials' outcomes", "dpbench/tuning/trials.py", "            put_back(storage, [trial_id])\n            raise",
           "            _finish(plan_, study, trial, number, None)\n            raise", first="tests/test_requeue.py"),
    Mutant("late-worker-tells", "tuning", "a worker whose trial was put back and claimed again by another run still "
           "writes its record and tells it", "dpbench/tuning/trials.py",
           "if not holds(study._storage, trial._trial_id):", "if False:", first="tests/test_requeue.py"),
    Mutant("partial-draw-redraws", "tuning", "random search draws a trial's hyperparameters in sequence from one "
           "stream, so a trial run again after a kill between two draws draws the rest from the stream's start: its "
           "draws are not the search distribution's", "dpbench/tuning/trials.py",
           "    return _KeyedRandomSampler(secret, trial_number, list(plan_.distributions))",
           "    return optuna.samplers.RandomSampler(seed=seed)", first="tests/test_requeue.py"),
    Mutant("heartbeat-dies-on-error", "tuning", "one storage error (Optuna's StorageInternalError) ends a trial's "
           "heartbeats: the live trial is taken for dead, run again and, alone, counted", "dpbench/tuning/claims.py",
           "except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError):",
           "except sqlalchemy.exc.SQLAlchemyError:", first="tests/test_requeue.py"),
    Mutant("postgres-session-tz", "tuning", "a PostgreSQL worker's session keeps its role's or database's time zone: "
           "heartbeats (naive session times) of workers in other zones look stale or never stale",
           "dpbench/tuning/study.py", '                sqlalchemy.event.listen(storage.engine, "connect", _utc)',
           "                pass", first="tests/test_tuning_postgres.py::test_every_workers_session_is_in_utc"),
    Mutant("utc-pooled-connections", "tuning", "the connections Optuna opened before the UTC listener stay pooled "
           "in the session's own zone (PGTZ, the role's)", "dpbench/tuning/study.py",
           "                storage.engine.dispose()  # the connections Optuna opened before the listener\n", "",
           first="tests/test_tuning_postgres.py"),
    Mutant("utc-not-committed", "tuning", "the UTC setting is left in the connection's first transaction, so the "
           "pool's rollback undoes it", "dpbench/tuning/study.py", "    cursor.close()\n    connection.commit()",
           "    cursor.close()", first="tests/test_tuning_postgres.py"),
    Mutant("sweep-close-no-put-back", "tuning", "the sweep terminates its Dask workers with their trials still "
           "claimed: the trials go stale and a lone trial's death counts, so the sweep's own stops decide its FAIL",
           "dpbench/board/sweep.py", "            client.run(claims.put_back_held)\n", "            pass\n",
           first="tests/test_requeue.py::test_a_sweeps_close_puts_its_workers_claims_back_uncounted"),
    Mutant("stopping-still-claims", "tuning", "a worker whose claims were put back goes on claiming until it is "
           "terminated: the new claims die with it and count", "dpbench/tuning/claims.py", "        if _STOPPING:\n",
           "        if False:\n",
           first="tests/test_requeue.py::test_a_process_that_put_its_claims_back_claims_nothing_more"),
    Mutant("setup-k-redrawn", "tuning", "a worker finishing the setup of a study whose creator died draws K from a "
           "secret of its own: a stop during the setup (whose length grows with K) redraws K", "dpbench/tuning/study.py",
           'draw_k(config["k_distribution"], attrs["secret"])', 'draw_k(config["k_distribution"], streams.secret_seed())',
           first="tests/test_study_setup.py"),
    Mutant("setup-legacy-refused", "tuning", "a study an older dpbench left half-made after storing K is refused: run "
           "again under another name only where the stop missed its K-long enqueuing, K's law is conditioned",
           "dpbench/tuning/study.py", '    if "ready" not in attrs and "k" in attrs:', "    if False:",
           first="tests/test_study_setup.py::"
                 "test_a_study_an_older_dpbench_left_half_made_is_finished_with_its_k_or_refused_before_k"),
    Mutant("setup-not-atomic", "tuning", "the K trials are made outside the transaction the ready mark guards: "
           "workers opening a new study at once make more than K", "dpbench/tuning/study.py",
           '    _insert_attrs(storage, study_id, {"ready": True, "k": k}, trials=k)',
           '    _insert_attrs(storage, study_id, {}, trials=k)\n    _insert_attrs(storage, study_id, {"ready": True, "k": k})',
           first="tests/test_study_setup.py::test_a_worker_that_read_the_study_before_another_set_it_up_makes_no_trials"),
    Mutant("release-time", "tuning", "a released tuned record keeps its release's time, the study's duration (a "
           "function of K) to the second", "dpbench/tuning/released.py", "    return release_day(records.seal(record))",
           "    return records.seal(record)", first="tests/test_tuning.py::test_the_release_carries_its_day_not_its_time"),
    Mutant("heartbeat-mismatch", "tuning", "a worker joins a study with another heartbeat interval, so it takes the "
           "live trials of slower-beating workers for dead and counts their deaths", "dpbench/tuning/study.py",
           "    if beats is not None and beats != storage.heartbeat_interval:", "    if False:",
           first="tests/test_requeue.py"),
    Mutant("board-reads-unchecked-per-trial-epsilon", "board", "the infeasibility rule reads any record's "
           "per_trial_epsilon (a validation record's, which verify never checks, declares its whole column)",
           "dpbench/board/infeasible.py",
           "        if tuning.get(\"mode\") != \"random-stopping\" or tuning.get(\"private\") is not True or not _positive(epsilon):",
           "        if not _positive(epsilon):",
           first="tests/test_board_infeasible.py::test_random_stopping_is_declared_by_the_epsilon_each_trial_trains_at"),
    Mutant("board-inconsistent-runs-unchecked", "board", "a cell whose runs disagree on the unverified majority rate "
           "loses its collapsed test silently", "dpbench/board/check.py", "    if disagreeing:\n", "    if False:\n",
           first="tests/test_board_check.py::test_a_cell_whose_runs_disagree_on_the_majority_rate_is_reported"),
    Mutant("board-seed-set-unchecked", "board", "a cell of one seed (no interval, no t-test), or of seeds other than "
           "the grid's (picked, or copies under secret seeds), passes every check", "dpbench/board/check.py",
           "            if problem is not None:\n                found.append(Violation(\"seeds\"",
           "            if False:\n                found.append(Violation(\"seeds\"",
           first="tests/test_board_check.py::test_a_cell_whose_seeds_are_not_the_grids_is_reported_in_every_table"),
    Mutant("board-grid-seeds-ignored", "board", "the grid's seeds are not what the board asks of a cell",
           "dpbench/board/leaderboard.py", "        table.seeds_asked = asked.get(table.task, 0)\n",
           "        table.seeds_asked = None\n",
           first="tests/test_board_check.py::test_a_cell_whose_seeds_are_not_the_grids_is_reported_in_every_table"),
    Mutant("board-seeds-only-in-accuracy-tables", "board", "a table of another metric skips the seed check",
           "dpbench/board/check.py", "        for (row, column), cell in table.cells.items():\n"
           "            problem = _seeds(", "        for (row, column), cell in "
           "table.cells.items() if table.direction == \"higher\" else ():\n            problem = _seeds(",
           first="tests/test_board_check.py::test_a_cell_whose_seeds_are_not_the_grids_is_reported_in_every_table"),
    Mutant("board-mixed-code-unchecked", "board", "a method with runs of two versions of its code shows twice, "
           "unreported", "dpbench/board/check.py", "        found += _mixed_code(table)\n", "",
           first="tests/test_board_check.py::test_a_method_with_runs_of_two_versions_of_its_code_is_reported"),
    Mutant("board-boundary-not-pooled", "board", "a compute budget that binds on every task, but on no task alone "
           "significantly after Holm, is not listed", "dpbench/board/check.py",
           "        if len({task for task, _, _ in selections}) > 1:", "        if False:",
           first="tests/test_board_boundary.py::test_a_budget_that_binds_on_every_task_is_listed_though_no_task_alone_"
                 "shows_it"),
    Mutant("verify-test-set-type-unchecked", "verify", "n_test as a float (equal, but the board's interval then falls "
           "back to a wider one) passes", "dpbench/trust/plan_checks.py",
           "record[field] != value or type(record[field]) is not type(value):",
           "record[field] != value or isinstance(record[field], bool):",
           first="tests/test_verify.py::test_a_test_set_that_is_not_the_tasks_fails"),
    Mutant("board-exception-cause-untested", "board", "a wide interval explained as a steep rise without the test at "
           "the cell (the next ε's mean above this cell's upper bound)", "benchmarks/violation_causes.py",
           "        if larger and board.cells[row + (larger[0],)].mean > cell.ci95[1]:", "        if larger:",
           first="tests/test_committed_board.py::test_the_committed_exceptions_are_what_their_tests_find"),
    Mutant("board-exception-defaults-degenerate", "board", "an untuned cell whose every seed sits exactly at the "
           "majority rate (an output the noise does not move) explained as untuned defaults",
           "benchmarks/violation_causes.py", "            and not board.degenerate(key)):", "            ):",
           first="tests/test_committed_board.py::test_the_committed_exceptions_are_what_their_tests_find"),
    Mutant("board-exception-adaclip-unreproduced", "board", "an untuned AdaCliP collapse explained by its transcription "
           "without its run and its control at the cell's own noise", "benchmarks/violation_causes.py",
           "len(quiet) >= 2 and len(pinned) >= 2 and all(abs(a - rate) < 1e-3 for a in here + quiet)",
           "len(quiet) >= 2 and all(abs(a - rate) < 1e-3 for a in quiet)",
           first="tests/test_committed_board.py::test_the_committed_exceptions_are_what_their_tests_find"),
    Mutant("board-exception-degenerate-selection-unchecked", "board", "a random-stopping cell whose studies mostly "
           "released a majority-class model explained as the track's variance", "benchmarks/violation_causes.py",
           "            and 2 * board.at_majority(key) < len(cell.values)):", "            ):",
           first="tests/test_committed_board.py::test_the_committed_exceptions_are_what_their_tests_find"),
    Mutant("board-exception-part-kind-ignored", "board", "a part of an exception explains its cells for every kind of "
           "its entry, not the kind they were tested for", "dpbench/board/exceptions.py",
           "(self.kinds is None or violation.kind in self.kinds) and violation.task in self.tasks",
           "violation.task in self.tasks",
           first="tests/test_board_check.py::test_a_part_of_a_cause_names_the_kind_each_of_its_cells_was_tested_for"),
    Mutant("board-exception-part-kind-unchecked", "board", "a part of an exception may name a kind its entry does not",
           "dpbench/board/exceptions.py", "if part.kinds is not None and not set(part.kinds) <= set(listed):",
           "if False:",
           first="tests/test_board_check.py::test_a_part_of_a_cause_names_the_kind_each_of_its_cells_was_tested_for"),
    Mutant("board-exception-stall-most-seeds", "board", "a transcription cause explains a cell where most, not all, of "
           "its runs at the cell's noise score the majority rate", "benchmarks/violation_causes.py",
           "all(abs(a - rate) < 1e-3 for a in here + quiet)",
           "all(abs(a - rate) < 1e-3 for a in quiet) and 2 * sum(abs(a - rate) < 1e-3 for a in here) > len(here)",
           first="tests/test_committed_board.py::test_the_committed_exceptions_are_what_their_tests_find"),
    Mutant("board-history-timing-unchecked", "board", "the grid's note of cells whose release times are in git's "
           "history may name other cells than the history exposes", "benchmarks/history_timing.py",
           "if partial or noted != cells:", "if partial:",
           first="tests/test_committed_board.py::test_the_board_marks_every_random_stopping_cell_whose_release_times_"
                 "are_in_the_history"),
    Mutant("board-exception-part-without-kind", "board", "a part without a kind in an entry of several kinds explains "
           "its cells for all of them", "dpbench/board/exceptions.py",
           "if len(listed) > 1 and (part.kinds is None or len(part.kinds) != 1):", "if False:",
           first="tests/test_board_check.py::test_one_cause_may_name_irregular_cells_and_several_kinds"),
    Mutant("board-exception-transcription-ignores-board", "board", "a transcription explains a collapsed cell some of "
           "whose board seeds learn", "benchmarks/violation_causes.py",
           "and board.at_majority(key) == len(cell.values)):", "):",
           first="tests/test_benchmarks.py::test_a_transcription_explains_a_collapse_only_where_every_board_seed_"
                 "collapses"),
    Mutant("board-exception-transcription-other-settings", "board", "a transcription run at other settings than the "
           "cell's records (batch size, epochs, lr, clip) explains its collapse", "benchmarks/violation_causes.py",
           "            if settings == ours]", "            if True]",
           first="tests/test_benchmarks.py::test_a_transcription_explains_a_collapse_only_where_every_board_seed_"
                 "collapses"),
    Mutant("release-names-storage", "tuning", "a released tuned record names the study storage, where the secrets "
           "live", "dpbench/tuning/released.py", '"config": tuning_config(plan_)}  # not the storage',
           '"config": tuning_config(plan_), "storage": "sqlite:///owner/tuning.sqlite"}  # not the storage',
           first="tests/test_tuning.py::test_the_release_reveals_neither_k_nor_the_other_trials"),
    Mutant("verify-error-uncapped", "verify", "verify excuses any shortfall its numerical-error spread covers, however "
           "large (a tiny δ makes the spread unbounded)", "dpbench/trust/recompute.py",
           "    if shortfall > MAX_ERROR * spent:", "    if False:",
           first="tests/test_verify.py::test_no_numerical_error_excuses_more_than_one_percent_of_epsilon"),
    Mutant("verify-target-error-uncapped", "verify", "verify's target check excuses any excess its numerical-error "
           "spread covers", "dpbench/trust/record_checks.py", "spent - min(error(), MAX_ERROR * spent) > target",
           "spent - error() > target",
           first="tests/test_verify.py::test_no_numerical_error_excuses_more_than_one_percent_of_epsilon"),
    Mutant("verify-audit-claim-uncapped", "verify", "an audit's claim above its run's ε is excused by any numerical "
           "error, however large (a failed audit passes at a tiny δ)", "dpbench/trust/record_checks.py",
           "(excess > MAX_ERROR * spent or excess > error(beyond=excess))", "excess > error(beyond=excess)",
           first="tests/test_verify.py::test_a_failed_audit_cannot_pass_by_a_claim_its_numerical_error_covers_at_a_"
                 "tiny_delta"),
    Mutant("wandb-metadata-on", "tracking", "W&B records the command line (a --storage URL with its password) and "
           "the host", "dpbench/results/tracking.py",
           'RUN_SETTINGS = {"silent": True, "x_disable_meta": True,',
           'RUN_SETTINGS = {"silent": True, "x_disable_meta": False,',
           first="tests/test_wandb.py"),
    Mutant("verify-tuning-extra-fields", "verify", "a private tuning's record may carry fields no release writes "
           "(K, the selected trial)", "dpbench/trust/record_checks.py",
           '    extra = set(tuned) - PUBLIC_TUNING_FIELDS - {"storage"}', "    extra = set()",
           first="tests/test_verify.py::test_a_private_tuning_record_that_publishes_k_or_the_trials_fails"),
    Mutant("verify-tuning-shape-unchecked", "verify", "a private tuning's nested fields (configuration, validation, "
           "K's distribution, selected parameters, storage) may carry K or the selected trial",
           "dpbench/trust/record_checks.py", "    _check_tuning_shape(record, tuned)\n", "",
           first="tests/test_verify.py::test_k_nested_in_a_private_tuning_records_fields_fails"),
    Mutant("board-exception-any-kind", "board", "an exception entry explains a violation of any kind at its cells",
           "dpbench/board/exceptions.py", "return (violation.kind in self.kinds and self.relation",
           "return (self.relation",
           first="tests/test_committed_board.py::test_the_committed_check_lists_exactly_the_violations_no_cause_"
                 "explains"),
]


@dataclass
class Outcome:
    name: str
    area: str
    defect: str
    caught: bool
    test: str | None
    seconds: float
    commit: str = ""  # the checkout's commit the outcome was measured on (a resumed run mixes commits)


def _first_failure(output: str) -> str | None:
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)
    return match.group(1) if match else None


def run_mutant(mutant: Mutant, tests: list[str], timeout: float) -> Outcome:
    path = REPO / mutant.file
    original = path.read_text()
    if original.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name}: the snippet occurs {original.count(mutant.old)} times in "
                         f"{mutant.file}; update the mutant")
    if subprocess.run(["git", "diff", "--quiet", "--", mutant.file], cwd=REPO).returncode != 0:
        raise SystemExit(f"{mutant.file} has uncommitted changes: run the mutants on a clean checkout")
    # The mutant's likely catcher first, then the rest: the order changes how soon a failure shows, not whether.
    ordered = [mutant.first] if mutant.first else []
    rest = [test for test in tests if test != mutant.first]
    started = time.perf_counter()
    try:
        path.write_text(original.replace(mutant.old, mutant.new))
        for part in (ordered, rest):
            if not part:
                continue
            result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *part],
                                    cwd=REPO, capture_output=True, text=True, timeout=timeout)
            if result.returncode != 0:
                break
    finally:
        path.write_text(original)
    if result.returncode not in (0, 1):  # 1: a test failed; 2-5: interrupted, internal error, usage, none collected
        raise SystemExit(f"mutant {mutant.name}: pytest exited {result.returncode}, which is no test failing: "
                         f"{result.stdout.strip().splitlines()[-1:] or result.stderr.strip()[-200:]}")
    seconds = time.perf_counter() - started
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return Outcome(mutant.name, mutant.area, mutant.defect, result.returncode != 0,
                   _first_failure(result.stdout) if result.returncode != 0 else None, seconds, commit.stdout.strip())


def fingerprint(mutant: Mutant) -> str:
    """What an outcome was measured on: the mutant's defect, file, change and first test (a changed mutant, or one
    given another catcher, runs again)."""
    return hashlib.sha256(json.dumps([mutant.defect, mutant.file, mutant.old, mutant.new, mutant.first])
                          .encode()).hexdigest()[:16]


def resumed(path: Path, chosen: list[Mutant]) -> list[Outcome]:
    """The caught outcomes in ``path`` of chosen mutants whose fingerprint is unchanged (a survivor runs again: the
    tests may have been fixed since)."""
    prints = {m.name: fingerprint(m) for m in chosen}
    return [Outcome(**{k: v for k, v in row.items() if k != "mutant"}) for row in json.loads(path.read_text())
            if prints.get(row["name"]) == row.get("mutant") and row["caught"]]


def write(path: Path, outcomes: list[Outcome], chosen: list[Mutant]) -> None:
    """Every outcome so far, in the mutants' order, each with its mutant's fingerprint."""
    prints = {m.name: fingerprint(m) for m in chosen}
    order = [m.name for m in chosen]
    rows = sorted(outcomes, key=lambda o: order.index(o.name))
    path.write_text(json.dumps([asdict(o) | {"mutant": prints[o.name]} for o in rows], indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant names (default: all)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for one mutant's test run")
    parser.add_argument("--json", help="write the outcomes here, after every mutant")
    parser.add_argument("--resume", action="store_true",
                        help="keep --json's caught outcomes of mutants whose defect, file, change and first test "
                             "are unchanged")
    args = parser.parse_args()
    if args.resume and not args.json:
        parser.error("--resume needs --json")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    outcomes = resumed(Path(args.json), chosen) if args.resume and Path(args.json).exists() else []
    done = {o.name for o in outcomes}
    if done:
        print(f"resumed: {len(done)} outcomes kept from {args.json}", file=sys.stderr)
    print(f"{len(chosen)} mutants; privacy tests: {' '.join(PRIVACY_TESTS)}", file=sys.stderr)
    # A mutant counts as caught when the privacy tests fail: they must pass without it, or every mutant is "caught".
    started = time.perf_counter()
    baseline = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PRIVACY_TESTS],
                              cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    if baseline.returncode != 0:
        raise SystemExit(f"the privacy tests fail without any mutant ({_first_failure(baseline.stdout)}): fix that first")
    print(f"baseline: the privacy tests pass in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    for index, mutant in enumerate(chosen, 1):
        if mutant.name in done:
            continue
        outcome = run_mutant(mutant, PRIVACY_TESTS, args.timeout)
        outcomes.append(outcome)
        if args.json:
            write(Path(args.json), outcomes, chosen)
        print(f"[{index}/{len(chosen)}] {mutant.name}: {'caught by ' + str(outcome.test) if outcome.caught else 'SURVIVED'}"
              f" in {outcome.seconds:.0f} s", file=sys.stderr, flush=True)
    outcomes.sort(key=lambda o: [m.name for m in chosen].index(o.name))
    print("| defect | area | caught by | time to catch |")
    print("| --- | --- | --- | --- |")
    for o in outcomes:
        print(f"| `{o.name}`: {o.defect} | {o.area} | {f'`{o.test}`' if o.caught else '**not caught**'} | "
              f"{o.seconds:.0f} s |")
    return 0 if all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
