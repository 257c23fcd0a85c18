"""The checks of a release method's record (output perturbation, AMP): its ``privacy_ledger`` part by part, each
output-noise part's ε recomputed, the built-in output perturbation's sensitivity and AMP's budget split re-derived
from their papers, one part per one-vs-all classifier."""
from __future__ import annotations

import math
from typing import Any

import dp_accounting

from dpbench.method import ReleaseMethod
from dpbench.trust.plan_checks import _builtin, _classifiers
from dpbench.trust.recompute import (TOLERANCE, Mismatch, _at_least, _check_positive, _check_whole, _close, _epsilon,
                                     _error)


def _amp_budget(record: dict[str, Any]) -> tuple[float, float, float, float, float]:
    """(ε/K, δ/K, ε3/ε1, ε2/ε, L) of an AMP record: K classifiers (one objective part each), the budget fractions
    (AMP-NT's from ε/K, the benchmark's fit) and the Lipschitz constant L (AMP-NT's 1)."""
    hp, classes = record["hyperparameters"], sum(entry["what"].startswith("objective perturbation")
                                                  for entry in record["privacy_ledger"])
    epsilon_k, delta_k = record["epsilon_target"] / classes, record["delta"] / classes
    if record["method"] == "amp_nt":
        noise = max(min(0.88671 + 0.0186607 / epsilon_k**0.372906, 0.99), 1 - 1 / epsilon_k + 0.001)
        return epsilon_k, delta_k, noise, 0.01, 1.0
    return epsilon_k, delta_k, hp["noise_fraction"], hp["out_fraction"], hp["input_norm"]


def _check_amp_split(record: dict[str, Any]) -> None:
    """AMP's budget split and regularization, re-derived for each classifier's (ε/K, δ/K) (Iyengar et al. 2019,
    Algorithm 1 lines 1–3 and 6, as :class:`dpbench.release.mechanisms.AMPCalibration` reads them): both fractions
    in (0, 1) (a noise fraction above 1 let a record state ε1 below the ε3 its noise pays for: hostile review of 27
    November), ε1 − ε3 in (0, 1), Λ = rβ/(ε1 − ε3) with the benchmark's r = 2 and β = L², and each output part's
    δ2 = f_out·δ/K and sensitivity Δ2 = 2nγ/Λ (γ = ``gamma_n2``/n², AMP-NT's 1/n²), from which its ε is then
    recomputed; each objective part's δ1 = (1 − f_out)·δ/K."""
    hp, n, ledger = record["hyperparameters"], record["n_train"], record["privacy_ledger"]
    epsilon_k, delta_k, noise, out, lipschitz = _amp_budget(record)
    for what, value in (("noise_fraction", noise), ("out_fraction", out)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            raise Mismatch(f"AMP's {what} is {value!r}, not in (0, 1)")
    _check_positive(lipschitz, "input_norm")
    gamma = 1 / n**2 if record["method"] == "amp_nt" else hp["gamma_n2"] / n**2
    _check_positive(gamma, "γ")
    epsilon_objective = (1 - out) * epsilon_k
    curvature = epsilon_objective - noise * epsilon_objective
    if not 0 < curvature < 1:
        raise Mismatch(f"AMP's ε1 − ε3 = {curvature:g}, not in (0, 1)")
    out_sensitivity = 2 * n * gamma / (2 * lipschitz**2 / curvature)
    for index, entry in enumerate(ledger):
        output = entry["what"].startswith("output noise")
        _close((out if output else 1 - out) * delta_k, entry["delta"], f"privacy_ledger[{index}] delta")
        if output:
            _close(out_sensitivity, entry["sensitivity"], f"privacy_ledger[{index}] sensitivity 2nγ/Λ")


def _amp_classifiers(record: dict[str, Any]) -> None:
    """AMP's ledger: one objective and one output part per classifier
    (:func:`~dpbench.trust.plan_checks._classifiers`), each classifier's budget ε/K (checked per part by the
    caller)."""
    parts = {"objective perturbation b1": [], "output noise b2": []}
    for entry in record["privacy_ledger"]:
        head, _, suffix = entry["what"].partition(", classifier ")
        if head not in parts:
            raise Mismatch(f"an AMP ledger part {entry['what']!r} verify does not know")
        parts[head].append(suffix and f", classifier {suffix}")
    for what, found in parts.items():
        _classifiers(record, found, what)


def _output_classifiers(record: dict[str, Any]) -> None:
    """The built-in output perturbation's ledger: one output-noise part per classifier
    (:func:`~dpbench.trust.plan_checks._classifiers`)."""
    if record["method"] == "output_perturbation":
        _classifiers(record, [entry["what"].removeprefix("output noise") for entry in record["privacy_ledger"]],
                     "output noise")


def _check_relation(record: dict[str, Any]) -> None:
    """Every ledger part's ``neighbours`` is the record's relation, and a built-in release method's is replace-one
    (:data:`dpbench.release.mechanisms.NEIGHBOURS`: its analysis holds for no other): a record relabelled
    add/remove-one sat in the add/remove table beside DP-SGD (hostile review of 27 November)."""
    relation, method = record.get("neighbouring"), _builtin(record)
    if method is not None and issubclass(method, ReleaseMethod) and relation != "replace-one":
        raise Mismatch(f"neighbouring is {relation!r}, but {record['method']}'s analysis holds under replace-one only")
    for index, entry in enumerate(record["privacy_ledger"]):
        if entry.get("neighbours") != relation:
            raise Mismatch(f"privacy_ledger[{index}] is accounted under {entry.get('neighbours')!r} neighbours, the "
                           f"record under {relation!r}")


def _check_output_sensitivities(record: dict[str, Any]) -> None:
    """The built-in output perturbation's sensitivity, re-derived from its hyperparameters (Wu et al.: 2kLη/b
    convex, 2(L + λR)/(λn) strongly convex), for each output-noise part of its ledger, where the bounds hold: k and
    b whole numbers ≥ 1, L > 0; convex: 0 < η ≤ 2/β with β = L²/4 (a larger step is expansive), the default
    η = R/(L·√T) included; strongly convex: λ > 0 and R > 0 (a negative radius gave a sensitivity 10⁶ times too
    small: hostile review of 27 November)."""
    if record["method"] != "output_perturbation":
        return
    hp, n = record["hyperparameters"], record["n_train"]
    for key in ("epochs", "batch_size"):
        _check_whole(hp[key], f"output perturbation's {key}")
    lipschitz = hp["input_norm"]
    _check_positive(lipschitz, "input_norm")
    if hp["variant"] not in ("convex", "strongly_convex"):
        raise Mismatch(f"output perturbation's variant {hp['variant']!r} is neither convex nor strongly_convex")
    lr = hp["lr"]
    if hp["variant"] == "convex":
        if lr is None:  # the default step R/(L·√T), T = k·⌈n/b⌉ updates
            _check_positive(hp["radius"], "radius")
            lr = hp["radius"] / (lipschitz * math.sqrt(hp["epochs"] * math.ceil(n / hp["batch_size"])))
        _check_positive(lr, "lr")
        if lr > 2 / (lipschitz**2 / 4) * (1 + 1e-12):
            raise Mismatch(f"output perturbation's step η = {lr:g} exceeds 2/β = {8 / lipschitz**2:g}: the convex "
                           f"bound 2kLη/b does not hold")
    else:
        _check_positive(hp["regularization"], "regularization")
        _check_positive(hp["radius"], "radius")
    expected = (2 * hp["epochs"] * lipschitz * lr / hp["batch_size"] if hp["variant"] == "convex"
                else 2 * (lipschitz + hp["regularization"] * hp["radius"]) / (hp["regularization"] * n))
    for index, entry in enumerate(record["privacy_ledger"]):
        if entry["what"].startswith("output noise"):
            _close(expected, entry["sensitivity"], f"privacy_ledger[{index}] sensitivity (Wu et al.)")


def check_release(record: dict[str, Any]) -> None:
    """An untuned release record: its ledger's sums, its target, each part recomputed (output noise) or checked
    against its paper (AMP's objective part), the relation its analysis holds under."""
    ledger = record["privacy_ledger"]
    _check_relation(record)
    _close(math.fsum(entry["epsilon"] for entry in ledger), record["epsilon"], "epsilon (sum of the ledger)")
    _close(math.fsum(entry["delta"] for entry in ledger), record["delta"], "delta (sum of the ledger)")
    _close(ledger[0]["noise_std"] / ledger[0]["sensitivity"], record["noise_multiplier"], "noise_multiplier")
    if record["epsilon"] > record["epsilon_target"] * (1 + 1e-9):
        raise Mismatch(f"spent ε {record['epsilon']} exceeds the target {record['epsilon_target']}")
    n, amp = record["n_train"], record["method"] in ("amp", "amp_nt")
    if amp:
        _amp_classifiers(record)
        epsilon_k, _, noise_fraction, out_fraction, lipschitz = _amp_budget(record)
    _check_output_sensitivities(record)
    for index, entry in enumerate(ledger):
        what = f"privacy_ledger[{index}] ({entry['what']})"
        if entry["what"].startswith("output noise"):
            event = dp_accounting.GaussianDpEvent(entry["noise_std"] / entry["sensitivity"])
            _at_least(_epsilon(event, entry["delta"], "pld", "add-remove"), entry["epsilon"], f"{what} epsilon",
                      _error(event, entry["delta"], "pld", "add-remove"))
        elif amp and entry["what"].startswith("objective perturbation"):
            _close(2 * lipschitz / n, entry["sensitivity"], f"{what} sensitivity 2L/n")
            _close((1 - out_fraction) * epsilon_k, entry["epsilon"], f"{what} epsilon (ε1 of ε/K)")
            epsilon_noise = noise_fraction * entry["epsilon"]
            needed = entry["sensitivity"] * (1 + math.sqrt(2 * math.log(1 / entry["delta"]))) / epsilon_noise
            if entry["noise_std"] < needed * (1 - TOLERANCE):
                raise Mismatch(f"{what}: noise std {entry['noise_std']:.6g} is below the {needed:.6g} that "
                               f"AMP's theorem needs for ε1 = {entry['epsilon']}")
            mu = entry["sensitivity"] / entry["noise_std"]  # the proof's tail bound (dpbench.release.mechanisms.AMPCalibration)
            if 0.5 * math.erfc((epsilon_noise / mu - mu / 2) / math.sqrt(2)) > entry["delta"] * (1 + TOLERANCE):
                raise Mismatch(f"{what}: b1's privacy loss exceeds ε3 = {epsilon_noise:.6g} with probability above "
                               f"δ1 = {entry['delta']:.6g}")
        else:
            raise Mismatch(f"{what} is a release verify cannot recompute")
    _output_classifiers(record)
    if amp:
        _check_amp_split(record)
