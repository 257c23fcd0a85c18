"""ε recomputed from a record's mechanism with dp-accounting directly (the events built here, not by
:mod:`dpbench.privacy.accounting`), and compared with the record's within the accountant's numerical error, for
``dpbench verify`` (:mod:`dpbench.trust.verify`)."""
from __future__ import annotations

import math
from typing import Any, Callable

import dp_accounting
import numpy as np
from dp_accounting import pld, rdp


#: Relative tolerance of the figures verify recomputes in closed form (RDP, sums, sensitivities).
TOLERANCE = 1e-6
#: The most of a recomputed ε verify excuses as the accountant's numerical error, whatever the error's estimate: at a
#: δ near the PLD's tail truncation the spread of its variants grows without bound (87% of ε at δ = 3·10⁻¹⁴ on
#: kddcup99, where a record understating ε eightfold passed, a review of 28 November); the board's records need
#: 0.17% at most (kddcup99, δ = 6.4·10⁻¹²). A record whose ε the PLD cannot pin down to 1% is not certified.
MAX_ERROR = 0.01
#: The PLD accountant's discretization of privacy losses, as ``dpbench.privacy.accounting`` reports ε with
#: (dp-accounting's default).
PLD_INTERVAL = 1e-4
RELATIONS = {"add-remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
             "replace-one": dp_accounting.NeighboringRelation.REPLACE_ONE}
#: The DpEvents a record's ``data_release_events`` may name, rebuilt from their fields.
EVENTS = {cls.__name__: cls for cls in (dp_accounting.GaussianDpEvent, dp_accounting.LaplaceDpEvent,
                                        dp_accounting.NonPrivateDpEvent, dp_accounting.NoOpDpEvent,
                                        dp_accounting.ComposedDpEvent, dp_accounting.SelfComposedDpEvent,
                                        dp_accounting.PoissonSampledDpEvent)}


class Mismatch(Exception):
    """A record disagrees with what it claims."""


def _number(recorded: Any, recomputed: float, what: str) -> None:
    if not isinstance(recorded, (int, float)) or isinstance(recorded, bool) or math.isnan(recorded):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {recomputed:.10g}")


def _check_positive(value: Any, what: str) -> None:
    """A finite number > 0 (NaN compares false with everything, so a NaN target or σ would pass every check)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise Mismatch(f"{what} is {value!r}, not a finite number > 0")


def _check_whole(value: Any, what: str) -> None:
    """A whole number ≥ 1, as the engine takes counts (a float epochs charged a banded run √1.5 participations for 2)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Mismatch(f"{what} is {value!r}, not a whole number ≥ 1")


def _check_delta(delta: Any, what: str = "delta") -> None:
    """δ a real number in (0, 1): at δ ≥ 1 every mechanism is (0, δ)-DP, and a bool is no δ."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise Mismatch(f"{what} is {delta!r}, not a number in (0, 1)")


def _close(recomputed: float, recorded: Any, what: str) -> None:
    _number(recorded, recomputed, what)
    if not math.isclose(recomputed, recorded, rel_tol=TOLERANCE, abs_tol=1e-12):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {recomputed:.10g}")


Error = Callable[..., float]  # error(beyond=inf): the accountant's numerical error, or once it exceeds ``beyond``


def _at_least(spent: float, recorded: Any, what: str, error: Error) -> None:
    """One-sided: a record may state more ε than recomputed, never less by more than the accountant's ``error``
    (computed only when it is below, and only until it covers the shortfall: the verdict is the same), nor by more
    than :data:`MAX_ERROR` of it. A mechanism
    with no finite ε at the record's δ (δ = 0, a δ below the PLD's tail, a non-private event) proves nothing: refused,
    whatever the record states (∞ − ∞ is NaN, and every comparison with NaN is false)."""
    _number(recorded, spent, what)
    if not math.isfinite(spent):
        raise Mismatch(f"{what} is {recorded!r}, but the mechanism has no finite ε at this δ (recomputed {spent})")
    if recorded >= spent:
        return
    shortfall = spent - recorded
    if shortfall > MAX_ERROR * spent:
        raise Mismatch(f"{what} is {recorded!r}, recomputed {spent:.10g} (less by {shortfall / spent:.3g} of it, more "
                       f"than the {MAX_ERROR:.0%} verify excuses as numerical error at any δ)")
    if not math.isfinite(error(beyond=shortfall)):  # a variant with no finite ε: an error that excuses anything
        raise Mismatch(f"{what} is {recorded!r}, recomputed {spent:.10g}, but the accountant's numerical error at "
                       "this δ is not finite (δ at the edge of the PLD's tail)")
    if shortfall > error(beyond=shortfall):
        raise Mismatch(f"{what} is {recorded!r}, recomputed {spent:.10g} (less by more than the accountant's "
                       f"numerical error {error():.3g})")


def _rdp_error(spent: float) -> Error:
    """dp-accounting's RDP ε: closed forms minimised over the orders, no discretization; :data:`TOLERANCE`."""
    return lambda beyond=math.inf: max(TOLERANCE * abs(spent), 1e-12)


def _event(fields: dict[str, Any]) -> dp_accounting.DpEvent:
    """A DpEvent from ``dpbench.privacy.accounting.event_fields``'s form."""
    fields = dict(fields)
    cls = EVENTS.get(fields.pop("class_name", None))
    if cls is None:
        raise Mismatch(f"data release event {fields} is not one verify can rebuild")
    for key, value in fields.items():
        if isinstance(value, dict):
            fields[key] = _event(value)
        elif isinstance(value, list):
            fields[key] = [_event(item) for item in value]
    return cls(**fields)


_EPSILONS: dict[tuple, float] = {}  # a file's seeds share their mechanisms


def _epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str,
             interval: float = PLD_INTERVAL) -> float:
    key = (repr(event), delta, accountant, relation, interval)  # an event's repr names every field (attrs)
    if key not in _EPSILONS:
        _EPSILONS[key] = _compute_epsilon(event, delta, accountant, relation, interval)
    return _EPSILONS[key]


def _compute_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str,
                     interval: float) -> float:
    if relation not in RELATIONS:
        raise Mismatch(f"neighbouring relation {relation!r} is not one verify knows")
    if accountant == "pld":
        found = pld.PLDAccountant(RELATIONS[relation], value_discretization_interval=interval)
    elif accountant == "rdp":  # dp-accounting's RDP reads a Gaussian as sensitivity 1 whatever the relation
        # under replace-one: doubled sensitivities, composed under REPLACE_SPECIAL (the only relation of the tree event)
        found = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL
                                  if relation == "replace-one" else RELATIONS[relation])
        event = _doubled(event) if relation == "replace-one" else event
    else:
        raise Mismatch(f"accountant {accountant!r} is not one verify knows")
    return float(found.compose(event).get_epsilon(delta))


def _doubled(event: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
    """Under replace-one a Gaussian release of noise σC moves by up to 2C: RDP α(2C)²/(2σ²C²) (Mironov 2017,
    Proposition 7), that of ``GaussianDpEvent(σ/2)``. Other events have no replace-one RDP analysis here. Written
    again rather than imported from :mod:`dpbench.privacy.accounting`: verify checks that module's results."""
    if isinstance(event, dp_accounting.GaussianDpEvent):
        return dp_accounting.GaussianDpEvent(event.noise_multiplier / 2)
    if isinstance(event, dp_accounting.SingleEpochTreeAggregationDpEvent):  # each node's sum moves by ≤ 2C
        return dp_accounting.SingleEpochTreeAggregationDpEvent(event.noise_multiplier / 2, event.step_counts)
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(_doubled(event.event), event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent([_doubled(inner) for inner in event.events])
    if isinstance(event, (dp_accounting.NoOpDpEvent, dp_accounting.NonPrivateDpEvent)):
        return event
    raise Mismatch(f"no replace-one RDP analysis of {type(event).__name__}: such a record needs the pld accountant")


def _scaled(event: dp_accounting.DpEvent, factor: float) -> dp_accounting.DpEvent:
    """``event`` with every noise scale times ``factor``."""
    if isinstance(event, (dp_accounting.GaussianDpEvent, dp_accounting.LaplaceDpEvent)):
        return type(event)(event.noise_multiplier * factor)
    if isinstance(event, dp_accounting.SingleEpochTreeAggregationDpEvent):
        return type(event)(event.noise_multiplier * factor, event.step_counts)
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
        return dp_accounting.PoissonSampledDpEvent(event.sampling_probability, _scaled(event.event, factor))
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return dp_accounting.SelfComposedDpEvent(_scaled(event.event, factor), event.count)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return dp_accounting.ComposedDpEvent([_scaled(inner, factor) for inner in event.events])
    return event


#: The PLD's discretization intervals (× :data:`PLD_INTERVAL`) and noise scales (× σ) whose ε :func:`_error` spreads.
GRID_FACTORS = (2, 0.5, 1 - 1e-6, 1 + 1e-6, 0.999, 1.001, 0.99, 1.01)
SCALE_FACTORS = (1 - 1e-12, 1 + 1e-12, 1 - 1e-9, 1 + 1e-9)


def _error(event: dp_accounting.DpEvent, delta: float, accountant: str, relation: str) -> Error:
    """The accountant's numerical error on ε for ``event``, for :func:`_at_least`: the spread (max − min) of the
    PLD's ε over its discretization interval Δ (``value_discretization_interval``, :data:`PLD_INTERVAL`) at Δ and Δ
    times :data:`GRID_FACTORS`, and over the noise scales times :data:`SCALE_FACTORS`.

    dp-accounting's PLD (connect-the-dots, pessimistic) rounds privacy losses to a grid of interval Δ and composes
    by FFT, dropping tail masses below 10⁻¹⁵; machines differ in the last bits of the losses (which grid point a
    borderline loss lands on) and of the FFT, whose rounding in the tail moves δ(ε) by ~10⁻¹⁴. At a δ of 10⁻¹⁰ or
    more that is ~10⁻⁶ of ε; at the δ = 6.4·10⁻¹² of kddcup99 (n = 395,216) it is ~10⁻³: this machine recomputes
    the committed board's kddcup99 ε 0.99992 as 1.00034 and its ε 7.99539 as 7.99919, and perturbing σ by 10⁻¹²
    moves them by up to 1.4·10⁻³ relative. The spread reads these effects from the accountant's own parameters and
    the record's mechanism; measured: adult (δ 7.6·10⁻¹⁰) 1.2·10⁻⁴ relative against 1.4·10⁻⁶ and 2.9·10⁻⁶ between
    machines (``tests/test_verify.py``), kddcup99 5.1·10⁻⁴ and 2.7·10⁻³ against 4.8·10⁻⁴ and 4.2·10⁻⁴. A third
    machine (28 November 2026) recomputed the 45 untuned kddcup99 records at ε = 2 (recorded 1.99848) as 2.00123,
    1.4·10⁻³ relative, beyond the spread of the seven variants used until then (0.00236, from Δ ×{2, ½, 1 ± 10⁻⁶}
    and σ(1 ± 10⁻¹²)): the variants sample a chaotic dependence, and seven samples underestimated its range. With
    the thirteen here the spread there is 0.00345; the range of sixteen such variants measured by hand was 0.0051
    (1.9974 to 2.0025). At this δ a PLD ε is known to about ±0.1%, which calibration to an ε target does not yet
    allow for. The RDP accountant: :func:`_rdp_error`."""
    if accountant != "pld":
        return _rdp_error(_epsilon(event, delta, accountant, relation))
    variants = [lambda: _epsilon(event, delta, "pld", relation)]  # the recomputation (cached), then the coarser grid
    variants += [lambda f=f: _epsilon(event, delta, "pld", relation, PLD_INTERVAL * f) for f in GRID_FACTORS]
    variants += [lambda f=f: _epsilon(_scaled(event, f), delta, "pld", relation) for f in SCALE_FACTORS]

    def spread(beyond: float = math.inf) -> float:
        """max − min over the variants, computed in turn until it exceeds ``beyond`` (a spread only grows)."""
        values = []
        for variant in variants:
            values.append(variant())
            if max(values) - min(values) > beyond:
                break
        return max(values) - min(values)

    return spread


_RDPS: dict[tuple, np.ndarray] = {}  # the studies of a cell (its tuning seeds) share their trial mechanism


def _rdp(event: dp_accounting.DpEvent, orders: np.ndarray, relation: str) -> np.ndarray:
    """RDP of ``event`` from dp-accounting's add/remove accountant; under replace-one by the weak triangle inequality
    of Rényi divergence (Mironov 2017, Proposition 11): ρ_rep(α) ≤ (α − ½)/(α − 1)·ρ(2α) + ρ(2α − 1). Computed once
    per (event, orders, relation): the committed board's 1,200 random-stopping records spent 572 of verify's 1,512 s
    here, five records (tuning seeds) to a mechanism."""
    key = (repr(event), tuple(float(a) for a in orders), relation)
    if key not in _RDPS:
        _RDPS[key] = _compute_rdp(event, orders, relation)
    return _RDPS[key].copy()


def _compute_rdp(event: dp_accounting.DpEvent, orders: np.ndarray, relation: str) -> np.ndarray:
    if relation == "add-remove":
        accountant = rdp.RdpAccountant(orders=[float(a) for a in orders])
        accountant.compose(event)
        return np.asarray(accountant.rdp, dtype=np.float64)
    if relation != "replace-one":
        raise Mismatch(f"neighbouring relation {relation!r} is not one verify knows")
    doubled = _compute_rdp(event, np.concatenate([2 * orders, 2 * orders - 1]), "add-remove")
    return (orders - 0.5) / (orders - 1) * doubled[:len(orders)] + doubled[len(orders):]
