"""Do predictions rank devices by throughput the way measurements do?

A row is one workload (a case) on one device: its measured and predicted throughput in
samples per second. The rows of a case measured on two or more devices form a group. Per
group: the measured and the predicted order of the devices, Kendall's tau-b, the pairwise
agreement, and for every pair of devices the predicted against the measured speed ratio
(faster device over slower, as measured). Over all groups: the pairwise agreement over every
pair, the mean tau, and the mean absolute error of the natural-log speed ratios.

Ties. Two throughputs tie when they differ by at most ``tie_tolerance`` of the larger one
(0: only equal values tie). Tau is tau-b: pairs tied on either side shrink its denominator,
and it is NaN when every pair of one side ties. Pairwise agreement is Harrell's concordance
index: a pair the measurement ties has no order to agree with and is left out; a pair the
prediction ties (and the measurement does not) scores one half.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Order = Literal["agree", "disagree", "predicted tie", "measured tie"]


@dataclass(frozen=True)
class ThroughputRow:
    """One case on one device. Throughputs in samples (images, sequences) per second."""

    case: str
    device: str
    measured_samples_per_s: float
    predicted_samples_per_s: float

    def __post_init__(self) -> None:
        for name in ("measured_samples_per_s", "predicted_samples_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{self.case} on {self.device}: {name} must be a positive "
                                 f"finite number (got {value})")


@dataclass(frozen=True)
class PairComparison:
    """Two devices of a group, the faster as measured first (input order on a measured tie)."""

    faster: str
    slower: str
    measured_speed_ratio: float  # faster / slower, measured (1 or more)
    predicted_speed_ratio: float  # faster / slower, predicted (below 1: predicted reversed)
    order: Order

    @property
    def ratio_error(self) -> float:
        """Predicted over measured speed ratio, less one (a fraction; +0.1: 10% too wide)."""
        return self.predicted_speed_ratio / self.measured_speed_ratio - 1

    @property
    def log_ratio_error(self) -> float:
        """ln(predicted ratio) - ln(measured ratio); symmetric in which device is first."""
        return math.log(self.predicted_speed_ratio) - math.log(self.measured_speed_ratio)

    @property
    def agreement_score(self) -> float | None:
        """1 agree, 0 disagree, 0.5 predicted tie; None when the measurement ties."""
        return {"agree": 1.0, "disagree": 0.0, "predicted tie": 0.5}.get(self.order)


@dataclass(frozen=True)
class GroupRanking:
    """One case measured on two or more devices."""

    case: str
    rows: tuple[ThroughputRow, ...]
    measured_order: tuple[str, ...]  # devices, fastest first
    predicted_order: tuple[str, ...]
    kendall_tau: float  # tau-b; NaN when one side ties every pair
    pairs: tuple[PairComparison, ...]
    tie_tolerance: float = 0.0

    @property
    def pairwise_agreement(self) -> float:
        """Fraction of pairs ordered as measured (Harrell's C); NaN with no ordered pair."""
        return _agreement(self.pairs)

    @property
    def mean_abs_log_ratio_error(self) -> float:
        return float(np.mean([abs(p.log_ratio_error) for p in self.pairs]))

    def order_text(self, which: Literal["measured", "predicted"]) -> str:
        """The order as 'a > b = c' (= for a tie within the tolerance)."""
        order = self.measured_order if which == "measured" else self.predicted_order
        value = {r.device: (r.measured_samples_per_s if which == "measured"
                            else r.predicted_samples_per_s) for r in self.rows}
        text = order[0]
        for previous, device in itertools.pairwise(order):
            tied = _sign(value[previous], value[device], self.tie_tolerance) == 0
            text += (" = " if tied else " > ") + device
        return text


@dataclass(frozen=True)
class RankingSummary:
    """Every group, and the agreement over all of them."""

    groups: tuple[GroupRanking, ...]

    @property
    def pairs(self) -> tuple[PairComparison, ...]:
        return tuple(p for g in self.groups for p in g.pairs)

    @property
    def pairwise_agreement(self) -> float:
        """Harrell's C over every pair of every group; NaN with no ordered pair."""
        return _agreement(self.pairs)

    @property
    def mean_kendall_tau(self) -> float:
        """Mean tau-b over the groups where it is defined; NaN when none is."""
        taus = [g.kendall_tau for g in self.groups if not math.isnan(g.kendall_tau)]
        return float(np.mean(taus)) if taus else math.nan

    @property
    def mean_abs_log_ratio_error(self) -> float:
        """Mean |ln(predicted ratio / measured ratio)| over every pair; NaN with none."""
        pairs = self.pairs
        return float(np.mean([abs(p.log_ratio_error) for p in pairs])) if pairs else math.nan

    @property
    def typical_ratio_error(self) -> float:
        """exp(mean absolute log ratio error) - 1: the typical factor a ratio is off by."""
        return math.exp(self.mean_abs_log_ratio_error) - 1


def _sign(a: float, b: float, tie_tolerance: float) -> int:
    if abs(a - b) <= tie_tolerance * max(abs(a), abs(b)):
        return 0
    return 1 if a > b else -1


def _pair_signs(values: Sequence[float], tie_tolerance: float) -> np.ndarray:
    """sign(v_i - v_j) for every i < j, 0 for a tie within the tolerance."""
    v = np.asarray(values, dtype=float)
    i, j = np.triu_indices(len(v), k=1)
    diff = v[i] - v[j]
    tied = np.abs(diff) <= tie_tolerance * np.maximum(np.abs(v[i]), np.abs(v[j]))
    return np.where(tied, 0, np.sign(diff)).astype(int)


def _check_lengths(measured: Sequence[float], predicted: Sequence[float]) -> None:
    if len(measured) != len(predicted):
        raise ValueError(f"{len(measured)} measured against {len(predicted)} predicted values")


def kendall_tau(measured: Sequence[float], predicted: Sequence[float],
                tie_tolerance: float = 0.0) -> float:
    """Kendall's tau-b of two orderings of the same items: (C - D) / sqrt((n0 - t_m)(n0 -
    t_p)), with n0 pairs, t_m and t_p of them tied in the measured and predicted values.
    1: the same order; -1: reversed; NaN when either side ties every pair (or n < 2)."""
    _check_lengths(measured, predicted)
    sm, sp = _pair_signs(measured, tie_tolerance), _pair_signs(predicted, tie_tolerance)
    n0 = len(sm)
    denominator = math.sqrt(float(n0 - np.count_nonzero(sm == 0))
                            * float(n0 - np.count_nonzero(sp == 0)))
    return float(np.sum(sm * sp)) / denominator if denominator else math.nan


def pairwise_agreement(measured: Sequence[float], predicted: Sequence[float],
                       tie_tolerance: float = 0.0) -> float:
    """Fraction of pairs that prediction orders as measured (Harrell's C: pairs the
    measurement ties are left out, pairs only the prediction ties count one half)."""
    _check_lengths(measured, predicted)
    sm, sp = _pair_signs(measured, tie_tolerance), _pair_signs(predicted, tie_tolerance)
    ordered = sm != 0
    if not ordered.any():
        return math.nan
    score = np.where(sp[ordered] == 0, 0.5, (sm[ordered] == sp[ordered]).astype(float))
    return float(score.mean())


def _agreement(pairs: Iterable[PairComparison]) -> float:
    scores = [s for p in pairs if (s := p.agreement_score) is not None]
    return float(np.mean(scores)) if scores else math.nan


def _order(rows: Sequence[ThroughputRow], predicted: bool) -> tuple[str, ...]:
    def key(r: ThroughputRow) -> float:
        return -(r.predicted_samples_per_s if predicted else r.measured_samples_per_s)

    return tuple(r.device for r in sorted(rows, key=key))  # stable: input order on ties


def _pair(a: ThroughputRow, b: ThroughputRow, tie_tolerance: float) -> PairComparison:
    if b.measured_samples_per_s > a.measured_samples_per_s:
        a, b = b, a
    sm = _sign(a.measured_samples_per_s, b.measured_samples_per_s, tie_tolerance)
    sp = _sign(a.predicted_samples_per_s, b.predicted_samples_per_s, tie_tolerance)
    order: Order = ("measured tie" if sm == 0 else "predicted tie" if sp == 0
                    else "agree" if sm == sp else "disagree")
    return PairComparison(a.device, b.device,
                          a.measured_samples_per_s / b.measured_samples_per_s,
                          a.predicted_samples_per_s / b.predicted_samples_per_s, order)


def rank_group(case: str, rows: Sequence[ThroughputRow],
               tie_tolerance: float = 0.0) -> GroupRanking:
    """Rank the devices of one case (two or more rows, one per device)."""
    devices = [r.device for r in rows]
    if len(rows) < 2:
        raise ValueError(f"{case}: a ranking needs two or more devices (got {devices})")
    if len(set(devices)) != len(devices):
        raise ValueError(f"{case}: a device appears twice ({devices})")
    if any(r.case != case for r in rows):
        raise ValueError(f"{case}: rows of another case given")
    measured = [r.measured_samples_per_s for r in rows]
    predicted = [r.predicted_samples_per_s for r in rows]
    pairs = tuple(_pair(rows[i], rows[j], tie_tolerance)
                  for i in range(len(rows)) for j in range(i + 1, len(rows)))
    return GroupRanking(case, tuple(rows), _order(rows, False), _order(rows, True),
                        kendall_tau(measured, predicted, tie_tolerance), pairs, tie_tolerance)


def group_rows(rows: Iterable[ThroughputRow]) -> dict[str, list[ThroughputRow]]:
    """Rows by case, in first-seen order, keeping the cases measured on two or more devices."""
    by_case: dict[str, list[ThroughputRow]] = defaultdict(list)
    for row in rows:
        by_case[row.case].append(row)
    return {case: group for case, group in by_case.items() if len(group) >= 2}


def rank(rows: Iterable[ThroughputRow], tie_tolerance: float = 0.0) -> RankingSummary:
    """Group ``rows`` by case and rank every group of two or more devices."""
    return RankingSummary(tuple(rank_group(case, group, tie_tolerance)
                                for case, group in group_rows(rows).items()))
