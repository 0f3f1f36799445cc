"""DP events: validation, exact costs, exact JSON round trip, canonical text."""

from __future__ import annotations

import json
from fractions import Fraction as F

import pytest

from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.core.events import (
    ComposedEvent,
    InvalidEventError,
    NoiseEvent,
    canonical_json,
    event_from_json,
    event_to_json,
)


def lap(stat="count", scale=F(10, 3), sens=F(1), **kw):
    return NoiseEvent("discrete_laplace", stat, scale, sensitivity=sens, **kw)


def gau(stat="sum", sigma=F(7, 2), l2sq=F(9), **kw):
    return NoiseEvent("discrete_gaussian", stat, sigma, l2_squared=l2sq, **kw)


def test_costs_are_exact():
    assert lap(scale=F(10, 3), sens=F(1)).natural_cost() == PureDP(F(3, 10))
    assert lap(scale=F(7), sens=F(3)).natural_cost() == PureDP(F(3, 7))
    # rho = l2^2 / (2 sigma^2) = 9 / (2 * 49/4) = 18/49
    assert gau(sigma=F(7, 2), l2sq=F(9)).natural_cost() == ZCDP(F(18, 49))


def test_parallel_flag_follows_partitions_per_unit():
    assert lap().parallel is True
    assert lap(partitions_per_unit=3).parallel is False
    assert lap(partitions_per_unit=3, parallel=False).parallel is False
    with pytest.raises(InvalidEventError):
        lap(partitions_per_unit=3, parallel=True)  # parallel composition would be false here
    with pytest.raises(InvalidEventError):
        lap(partitions_per_unit=1, parallel=False)


@pytest.mark.parametrize("make", [
    lambda: NoiseEvent("laplace", "c", F(1), sensitivity=F(1)),          # not an exact mechanism
    lambda: NoiseEvent("discrete_laplace", "", F(1), sensitivity=F(1)),
    lambda: NoiseEvent("discrete_laplace", "c", F(0), sensitivity=F(1)),
    lambda: NoiseEvent("discrete_laplace", "c", 0.5, sensitivity=F(1)),  # float scale: not exact
    lambda: NoiseEvent("discrete_laplace", "c", F(1)),                   # no sensitivity
    lambda: NoiseEvent("discrete_laplace", "c", F(1), sensitivity=F(1), l2_squared=F(1)),
    lambda: NoiseEvent("discrete_gaussian", "c", F(1), sensitivity=F(1)),
    lambda: NoiseEvent("discrete_gaussian", "c", F(1), l2_squared=F(0)),
    lambda: NoiseEvent("discrete_laplace", "c", F(1), sensitivity=F(1), cells=0),
    lambda: NoiseEvent("discrete_laplace", "c", F(1), sensitivity=F(1), cells=True),
    lambda: NoiseEvent("discrete_laplace", "c", F(1), sensitivity=F(1), partitions_per_unit=0),
    lambda: ComposedEvent(("not an event",)),
    lambda: ComposedEvent(None),
])
def test_invalid_events(make):
    with pytest.raises(InvalidEventError):
        make()


def test_frozen_and_hashable():
    e = ComposedEvent([lap(), gau(cells=12, grid_exponent=-20, partitions_per_unit=2)])
    assert isinstance(e.children, tuple)
    assert hash(e) == hash(ComposedEvent((lap(), gau(cells=12, grid_exponent=-20, partitions_per_unit=2))))
    assert len({e, e, lap()}) == 2
    with pytest.raises(AttributeError):
        lap().scale = F(1)


EVENTS = [
    lap(),
    lap(scale=F(1, 3), sens=F(2, 7), cells=365, partitions_per_unit=7),
    gau(sigma=F(123456789, 1000), l2sq=F(10**30 + 1, 3), grid_exponent=-20, cells=4),
    ComposedEvent(()),
    ComposedEvent((lap(), ComposedEvent((gau(), lap("mean_count", F(2)))))),
]


@pytest.mark.parametrize("e", EVENTS)
def test_json_round_trip_is_exact(e):
    d = event_to_json(e)
    text = json.dumps(d)
    back = event_from_json(json.loads(text))
    assert back == e and type(back) is type(e)
    assert canonical_json(back) == canonical_json(e)
    for leaf in (back.leaves() if isinstance(back, ComposedEvent) else (back,)):
        assert isinstance(leaf.scale, F)


def test_canonical_json_is_sorted_and_compact():
    text = canonical_json(lap(scale=F(1, 3)))
    assert " " not in text and "\n" not in text
    d = json.loads(text)
    assert list(d) == sorted(d)
    assert d["scale"] == "1/3" and d["sensitivity"] == "1"  # fractions as strings, never floats
    assert canonical_json(lap(scale=F(2, 6))) == text  # same value, same text


def test_leaves():
    e = ComposedEvent((lap("a"), ComposedEvent((gau("b"), lap("c")))))
    assert [x.statistic for x in e.leaves()] == ["a", "b", "c"]


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(scale=0.3333),            # a float is not exact
    lambda d: d.update(scale="abc"),
    lambda d: d.update(scale="1/0"),
    lambda d: d.update(extra=1),
    lambda d: d.pop("cells"),
    lambda d: d.update(type="mystery"),
    lambda d: d.update(format=99),
    lambda d: d.update(parallel=False),           # inconsistent with partitions_per_unit = 1
])
def test_from_json_is_strict(mutate):
    d = event_to_json(lap())
    mutate(d)
    with pytest.raises(InvalidEventError):
        event_from_json(d)


def test_from_json_rejects_non_objects():
    for bad in (None, [], "x", {"type": "composed", "children": "no"}):
        with pytest.raises(InvalidEventError):
            event_from_json(bad)
