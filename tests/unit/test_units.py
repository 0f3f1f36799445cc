"""Privacy units, neighbour relations, bounds and the derived sensitivities (no Spark)."""

from __future__ import annotations

import itertools
from fractions import Fraction as F

import pytest

from dp_spark.errors import ConfigError, InvalidBoundsError, UnknownRelationError
from dp_spark.core.units import (
    Aggregate,
    ContributionBounds,
    Neighbouring,
    PrivacyUnit,
    Sensitivity,
    UnitKind,
    sensitivity,
)

AR, RP, EV = Neighbouring.ADD_REMOVE_UNIT, Neighbouring.REPLACE_UNIT, Neighbouring.EVENT
CNT, DST, SUM, NSUM = Aggregate.ROW_COUNT, Aggregate.DISTINCT_UNITS, Aggregate.SUM, Aggregate.NORMALISED_SUM

# K = 5, L0 = 3, Linf = 2, [L, U] = [-1, 4]: L0' = 3, Linf' = 2, M = 4, W = 5/2,
# min(K, L0'Linf') = 5 and min(K^2, L0'Linf'^2) = 12, so every term of the formulas shows.
B = ContributionBounds(max_rows_per_unit=5, max_partitions_per_unit=3, max_rows_per_partition=2,
                       lower=-1, upper=4)
# event level: one row per event id, the only bounds sensitivity() accepts under `event`
B_EVENT = ContributionBounds(max_rows_per_unit=1, max_partitions_per_unit=1, max_rows_per_partition=1,
                             lower=-1, upper=4)

TABLE = [
    # relation, aggregate, per_partition, l1, l2_squared, reason
    (AR, CNT, 2, 5, 12, "a unit adds <= Linf' rows to a cell, <= K rows in all, over <= L0' cells"),
    (AR, DST, 1, 3, 3, "a unit is counted once in each of the <= L0' cells it touches"),
    (AR, SUM, 8, 20, 192, "each row moves a sum by <= M = max(|L|,|U|): the count bounds times M"),
    (AR, NSUM, 5, F(25, 2), 75, "centred values move a sum by <= W = (U-L)/2: the count bounds times W"),
    (RP, CNT, 2, 10, 24, "old and new counts are non-negative: |a-b| <= max(a,b), ||a-b||^2 <= ||a||^2+||b||^2"),
    (RP, DST, 1, 6, 6, "one unit leaves <= L0' cells and another enters <= L0' cells"),
    (RP, SUM, 10, 40, 768, "a cell ranges over Linf'[min(L,0), max(U,0)]; triangle inequality on the vector"),
    (RP, NSUM, 10, 25, 300, "a centred cell ranges over Linf'[-W, W], width Linf'(U-L); triangle inequality"),
    (EV, CNT, 1, 1, 1, "one event is one row in one cell"),
    (EV, DST, 1, 1, 1, "one event adds or removes at most its unit in its one cell"),
    (EV, SUM, 4, 4, 16, "one event is one value of magnitude <= M"),
    (EV, NSUM, F(5, 2), F(5, 2), F(25, 4), "one event is one centred value of magnitude <= W"),
]


def test_table_covers_every_relation_and_aggregate():
    assert {(r, a) for r, a, *_ in TABLE} == set(itertools.product(Neighbouring, Aggregate))


@pytest.mark.parametrize("relation,aggregate,per,l1,l2sq,reason", TABLE,
                         ids=[f"{r.value}-{a.value}" for r, a, *_ in TABLE])
def test_sensitivity_table(relation, aggregate, per, l1, l2sq, reason):
    b = B_EVENT if relation is EV else B
    s = sensitivity(aggregate, b, relation)
    assert (s.per_partition, s.l1, s.l2_squared) == (F(per), F(l1), F(l2sq)), reason
    assert all(isinstance(v, F) for v in (s.per_partition, s.l1, s.l2_squared))
    assert s.per_partition <= s.l1  # one cell never moves more than the whole vector
    assert s.l2 == pytest.approx(float(F(l2sq)) ** 0.5)
    # strings are accepted as well as enum members
    assert sensitivity(aggregate.value, b, relation.value) == s
    if relation is EV:  # the event entries are add_remove's with K = L0 = Linf = 1
        assert sensitivity(aggregate, b, AR) == s


@pytest.mark.parametrize("bounds", [
    B,
    ContributionBounds(max_rows_per_unit=2, lower=-1, upper=4),
    ContributionBounds(max_rows_per_unit=1, max_partitions_per_unit=2, lower=-1, upper=4),
    ContributionBounds(max_rows_per_unit=1, max_rows_per_partition=2, lower=-1, upper=4),
])
def test_event_relation_refuses_bounds_above_one(bounds):
    """One row in or out moves a cell by one row only when each event id keeps one row: any
    bound above 1 is refused (a clear error naming the bounds, not a silent sensitivity 1)."""
    for agg in Aggregate:
        with pytest.raises(InvalidBoundsError, match="neighbouring 'event' needs max_rows_per_unit"):
            sensitivity(agg, bounds, EV)
        with pytest.raises(InvalidBoundsError, match="max_rows_per_partition = 1"):
            sensitivity(agg.value, bounds, "event")
    # Linf = None means K = 1: accepted
    assert sensitivity(CNT, ContributionBounds(1), EV).l1 == 1


def test_k_caps_partitions_and_rows():
    # K = 2 < L0 = 3 and Linf defaults to K: L0' = Linf' = 2
    b = ContributionBounds(max_rows_per_unit=2, max_partitions_per_unit=3)
    assert b.effective_l0 == 2 and b.effective_linf == 2
    s = sensitivity(CNT, b, AR)
    assert (s.per_partition, s.l1, s.l2_squared) == (2, 2, 4)
    assert sensitivity(DST, b, AR).l1 == 2


def test_basic_user_level_count_and_sum():
    # MISSION 3: at most K orders per user -> user-level count sensitivity K; the sum K*max(|L|,|U|)
    b = ContributionBounds(max_rows_per_unit=10, lower=0, upper=250)
    assert sensitivity(CNT, b, AR).l1 == 10
    assert sensitivity(DST, b, AR).l1 == 1
    assert sensitivity(SUM, b, AR).l1 == 2500
    # Gaussian L2 = sqrt(partitions per unit) * per-partition bound (RELIABILITY 12)
    b3 = ContributionBounds(max_rows_per_unit=30, max_partitions_per_unit=3, max_rows_per_partition=10,
                            lower=0, upper=250)
    s = sensitivity(SUM, b3, AR)
    assert s.l2_squared == 3 * s.per_partition ** 2


def test_plain_sum_replace_is_not_u_minus_l():
    # (U - L) would only hold for replace-one with a public number of rows per unit
    b = ContributionBounds(max_rows_per_unit=1, lower=10, upper=20)
    assert sensitivity(SUM, b, RP).per_partition == 20  # max(U,0) - min(L,0), not 10
    assert sensitivity(NSUM, b, RP).per_partition == 10  # the centred sum: (U - L)


def _count_vectors(k, l0, linf, parts):
    for v in itertools.product(range(linf + 1), repeat=parts):
        if sum(v) <= k and sum(1 for x in v if x) <= l0:
            yield v


@pytest.mark.parametrize("k,l0,linf", [(1, 1, 1), (3, 2, 2), (4, 3, 1), (3, 3, 3), (5, 2, 3)])
def test_bounds_dominate_brute_force(k, l0, linf):
    """Every (relation, aggregate) bound >= the largest change over all bounded units (3 cells)."""
    parts, lo, hi = 3, F(-1), F(3)
    b = ContributionBounds(k, l0, linf, lower=lo, upper=hi)
    vecs = list(_count_vectors(k, l0, linf, parts))
    mid = (lo + hi) / 2

    def value_vectors(counts, vals):
        # every assignment of extreme values to the rows (sums are linear: extremes suffice)
        choices = [list({sum(c) for c in itertools.combinations_with_replacement(vals, n)}) for n in counts]
        return itertools.product(*choices)

    def norms(d):
        return max(abs(x) for x in d), sum(abs(x) for x in d), sum(x * x for x in d)

    contrib = {
        CNT: [tuple(F(x) for x in v) for v in vecs],
        DST: [tuple(F(1 if x else 0) for x in v) for v in vecs],
        SUM: [s for v in vecs for s in value_vectors(v, (lo, F(0), hi))],
        NSUM: [s for v in vecs for s in value_vectors(v, (lo - mid, hi - mid))],
    }
    for agg, cs in contrib.items():
        cs = sorted(set(cs))
        ar = [norms(c) for c in cs]
        rp = [norms(tuple(a - b_ for a, b_ in zip(c1, c2))) for c1 in cs for c2 in cs]
        for rel, observed in ((AR, ar), (RP, rp)):
            s = sensitivity(agg, b, rel)
            assert max(o[0] for o in observed) <= s.per_partition, (rel, agg)
            assert max(o[1] for o in observed) <= s.l1, (rel, agg)
            assert max(o[2] for o in observed) <= s.l2_squared, (rel, agg)


def test_bounds_defaults_and_exact_values():
    b = ContributionBounds(max_rows_per_unit=4, lower=0.1, upper="0.3")
    assert b.max_partitions_per_unit == 1 and b.max_rows_per_partition is None
    assert b.effective_linf == 4 and b.effective_l0 == 1
    assert b.lower == F(1, 10) and b.upper == F(3, 10)
    assert b.midpoint == F(1, 5) and b.half_width == F(1, 10) and b.magnitude == F(3, 10)
    assert ContributionBounds(3, max_rows_per_partition=7).effective_linf == 3
    assert hash(b) == hash(ContributionBounds(4, lower=F(1, 10), upper=F(3, 10)))
    assert ContributionBounds(2, lower=5, upper=5).half_width == 0  # degenerate but valid


SECRET = 987654.321


@pytest.mark.parametrize("kwargs", [
    dict(max_rows_per_unit=0),
    dict(max_rows_per_unit=-987654),
    dict(max_rows_per_unit=True),
    dict(max_rows_per_unit=2.5),
    dict(max_rows_per_unit=3, max_partitions_per_unit=0),
    dict(max_rows_per_unit=3, max_rows_per_partition=0),
    dict(max_rows_per_unit=3, lower=SECRET, upper=1),           # inverted
    dict(max_rows_per_unit=3, lower=float("nan"), upper=SECRET),
    dict(max_rows_per_unit=3, lower=0, upper=float("inf")),
    dict(max_rows_per_unit=3, lower=-float("inf"), upper=SECRET),
    dict(max_rows_per_unit=3, lower=SECRET),                     # one without the other
    dict(max_rows_per_unit=3, upper=SECRET),
    dict(max_rows_per_unit=3, lower="not a number", upper=SECRET),
])
def test_bad_bounds_raise_invalid_bounds_without_values(kwargs):
    with pytest.raises(InvalidBoundsError) as exc:
        ContributionBounds(**kwargs)
    msg = str(exc.value)
    assert "987654" not in msg and "nan" not in msg.lower() and "inf" not in msg.replace("info", "")


def test_sum_needs_clamp_bounds():
    b = ContributionBounds(3)
    for agg in (SUM, NSUM):
        for rel in Neighbouring:
            with pytest.raises(InvalidBoundsError):
                sensitivity(agg, b, rel)
    assert sensitivity(CNT, b, AR).l1 == 3


def test_unknown_relation_aggregate_kind():
    with pytest.raises(UnknownRelationError):
        sensitivity(CNT, B, "add_remove_user")
    with pytest.raises(UnknownRelationError):
        sensitivity("median", B, AR)
    with pytest.raises(UnknownRelationError):
        PrivacyUnit("household", "hh_id")
    with pytest.raises(InvalidBoundsError):
        sensitivity(CNT, {"max_rows_per_unit": 3}, AR)


def test_privacy_unit():
    u = PrivacyUnit("user", "user_id")
    assert u.kind is UnitKind.USER and u.column == "user_id"
    assert u == PrivacyUnit(UnitKind.USER, "user_id") and hash(u) == hash(PrivacyUnit(UnitKind.USER, "user_id"))
    assert PrivacyUnit(UnitKind.ACCOUNT, "buyer.account_id").column == "buyer.account_id"
    assert u.default_relation() is AR
    assert PrivacyUnit(UnitKind.EVENT, "event_id").default_relation() is EV
    for bad in ("", " ", "user id", "1abc", "a;drop", None, 3, "a..b"):
        with pytest.raises(ConfigError) as exc:
            PrivacyUnit(UnitKind.USER, bad)
        assert "drop" not in str(exc.value)
    with pytest.raises(AttributeError):
        u.column = "x"  # frozen


def test_enum_values_are_fixed():
    assert [k.value for k in UnitKind] == ["user", "account", "device", "event"]
    assert [n.value for n in Neighbouring] == ["add_remove_unit", "replace_unit", "event"]
    assert [a.value for a in Aggregate] == ["row_count", "distinct_units", "sum", "normalised_sum"]


def test_sensitivity_validation_and_scaling():
    s = Sensitivity(F(3), F(6), F(18))
    g = s.scaled(F(1, 4))
    assert (g.per_partition, g.l1, g.l2_squared) == (F(3, 4), F(3, 2), F(18, 16))
    with pytest.raises(ConfigError):
        Sensitivity(0.5, F(1), F(1))  # floats are not exact
    with pytest.raises(ConfigError):
        Sensitivity(F(-1), F(1), F(1))
