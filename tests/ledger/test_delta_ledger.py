"""Accounting with delta in the ledger (issue 14 item 2), on SQLite and PostgreSQL.

The ``ledger`` fixture is parametrised over both backends (tests/ledger/conftest.py), so this
is part of the ledger contract suite: charges carry delta, spent totals and the cap check
include it, a delta over the cap (or on a budget whose delta cap is 0) is refused with a
message naming the policy field, entries written without delta read as delta 0, and the
incremental spend summary, the chain and ``verify`` handle the new field.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from fractions import Fraction

import pytest

from dp_spark.accountant import DeltaCapExceededError
from dp_spark.core.budget import PureDP, ZCDP
from dp_spark.errors import BudgetExceededError
from dp_spark.ledger import ReleaseLimitExceededError
from dp_spark.ledger.records import PolicyChangedError, policy_hash
from dp_spark.ledger.policy import BudgetPolicy, WindowPolicy, policies_from_dict

EVENT = json.dumps({"type": "noise"})
D6 = Fraction(1, 10**6)


def zpolicy(budget_id: str = "z", *, rho="2", delta_cap=D6, window: str = "monthly",
            max_per_release=None) -> BudgetPolicy:
    return BudgetPolicy(budget_id=budget_id, dataset="ds", privacy_unit="user", measure="zcdp",
                        cap=ZCDP(rho, delta_cap), statement_delta=Fraction(1, 10**7),
                        window=WindowPolicy(window), max_per_release=max_per_release)


def ppolicy(budget_id: str = "p", *, eps="3", delta_cap=D6) -> BudgetPolicy:
    return BudgetPolicy(budget_id=budget_id, dataset="ds2", privacy_unit="user", measure="pure_dp",
                        cap=PureDP(eps, delta_cap))


def reserve(ledger, release_id, charge, budget="z", **kw):
    return ledger.reserve(budget, release_id, charge, EVENT, principal="alice", code_version="v1",
                          release_family="fam", owner_token="o", **kw)


def test_zcdp_charges_accumulate_rho_and_delta(ledger):
    ledger.register_budget(zpolicy())
    reserve(ledger, "r1", ZCDP("0.5", "4e-7"))
    reserve(ledger, "r2", ZCDP("0.25"))  # no delta: reads as 0
    st = ledger.status("z")
    assert st.spent == ZCDP("0.75", "4e-7")
    assert st.remaining == ZCDP("1.25", "6e-7")
    assert ledger.entries("z")[0].charge.delta == Fraction(4, 10**7)
    assert ledger.entries("z")[1].charge.delta == 0
    reserve(ledger, "r3", ZCDP("0.25", "6e-7"))  # exactly fills the delta cap
    assert ledger.status("z").remaining.delta == 0
    ledger.verify()


def test_a_delta_over_the_remaining_delta_is_refused_and_leaves_no_trace(ledger):
    ledger.register_budget(zpolicy())
    reserve(ledger, "r1", ZCDP("0.1", "8e-7"))
    with pytest.raises(BudgetExceededError) as info:
        reserve(ledger, "r2", ZCDP("0.1", "3e-7"))  # rho fits, delta does not
    err = info.value
    assert isinstance(err, DeltaCapExceededError)
    assert err.requested == ZCDP("0.1", "3e-7") and err.cap == zpolicy().cap
    text = str(err)
    assert "'z'" in text and "delta_cap" in text and "remaining" in text
    assert [e.release_id for e in ledger.entries("z")] == ["r1"]
    reserve(ledger, "r3", ZCDP("0.1", "2e-7"))  # what remains still fits
    ledger.verify()


def test_a_budget_with_delta_cap_0_refuses_delta_naming_the_field_to_add(ledger):
    ledger.register_budget(zpolicy("demo_events_user", delta_cap=0))
    reserve(ledger, "r0", ZCDP("0.5"), budget="demo_events_user")  # without delta: works as before
    with pytest.raises(DeltaCapExceededError) as info:
        reserve(ledger, "r1", ZCDP("0.5", "1e-8"), budget="demo_events_user")
    text = str(info.value)
    assert ("budget 'demo_events_user' has delta_cap 0: a release that spends delta (private keys) needs "
            "`delta_cap:` in budgets.demo_events_user of the policy file") in text
    assert len(ledger.entries("demo_events_user")) == 1


def test_pure_dp_budget_accumulates_epsilon_and_delta(ledger):
    ledger.register_budget(ppolicy())
    reserve(ledger, "r1", PureDP("1", "5e-7"), budget="p")
    reserve(ledger, "r2", PureDP("1"), budget="p")
    assert ledger.status("p").spent == PureDP(2, Fraction(5, 10**7))
    with pytest.raises(DeltaCapExceededError):
        reserve(ledger, "r3", PureDP("0.5", "6e-7"), budget="p")
    with pytest.raises(BudgetExceededError) as info:  # epsilon does not fit: the plain error
        reserve(ledger, "r4", PureDP("1.5"), budget="p")
    assert not isinstance(info.value, DeltaCapExceededError)


def test_max_per_release_without_delta_limits_rho_only_with_delta_it_limits_both(ledger):
    ledger.register_budget(zpolicy("a", max_per_release=ZCDP(1)))
    reserve(ledger, "r1", ZCDP("1", "1e-7"), budget="a")  # delta bounded by the delta cap only
    with pytest.raises(ReleaseLimitExceededError):
        reserve(ledger, "r2", ZCDP("1.5"), budget="a")
    ledger.register_budget(zpolicy("b", max_per_release=ZCDP(1, Fraction(1, 10**7))))
    reserve(ledger, "r3", ZCDP("1", "1e-7"), budget="b")
    with pytest.raises(ReleaseLimitExceededError):
        reserve(ledger, "r4", ZCDP("0.1", "2e-7"), budget="b")


def test_the_spend_summary_and_windows_carry_delta(ledger, clock):
    """The incremental summary (O(1) reserve) and a rebuilt one agree, delta included; a new
    window renews the delta too."""
    ledger.register_budget(zpolicy(window="daily"))
    reserve(ledger, "r1", ZCDP("0.5", "5e-7"))
    clock.advance(hours=1)
    reserve(ledger, "r2", ZCDP("0.5", "5e-7"))
    with pytest.raises(DeltaCapExceededError):
        reserve(ledger, "r3", ZCDP("0.1", "1e-9"))
    ledger.verify()  # checks the summary's totals against the entries
    clock.advance(days=1)
    assert ledger.status("z").spent == ZCDP.zero()
    reserve(ledger, "r4", ZCDP("0.5", "1e-6"))
    assert ledger.status("z").spent == ZCDP("0.5", D6)
    ledger.verify()


def test_reserve_takeover_keeps_the_charge_with_delta(ledger, clock):
    ledger.register_budget(zpolicy())
    r = reserve(ledger, "r1", ZCDP("0.5", "1e-7"), lease_seconds=10)
    clock.advance(seconds=20)
    again = ledger.reserve("z", "r1", ZCDP("0.5", "1e-7"), EVENT, principal="bob", code_version="v1",
                           release_family="fam", owner_token="o2")
    assert again.reused and again.entry.charge == r.entry.charge
    ledger.commit("r1", "o2")
    assert ledger.status("z").spent == ZCDP("0.5", "1e-7")


def test_delta_cap_in_the_stored_policy_only_when_non_zero(ledger):
    """A budget without delta keeps the policy JSON and hash it always had (hard-coded from
    the code before delta existed); adding delta_cap is a policy change an admin accepts."""
    doc = {"version": 1, "budgets": {"demo_events_user": {
        "dataset": "demo_events", "privacy_unit": "user", "measure": "zcdp", "cap": {"rho": 2.0},
        "statement_delta": 1.0e-7, "window": "monthly", "max_per_release": {"rho": 1.0}}}}
    old = policies_from_dict(doc)["demo_events_user"]
    assert policy_hash(old) == "d438b8b189f6c1cabd468d0745e25a3e811450e05578416b3532faf3c0174e15"
    assert "delta_cap" not in old.to_json() and "delta" not in old.to_json()["cap"]
    ledger.register_budget(old)
    doc["budgets"]["demo_events_user"]["delta_cap"] = 1.0e-6
    new = policies_from_dict(doc)["demo_events_user"]
    assert new.to_json()["delta_cap"] == "1/1000000" and new.cap == ZCDP(2, D6)
    with pytest.raises(PolicyChangedError, match="accept-policy --budget demo_events_user"):
        ledger.register_budget(new)
    rec = ledger.accept_policy(new, principal="admin_carol", reason="private keys")
    assert rec is not None and rec.version == 2 and any("delta_cap" in c for c in rec.changes)
    assert ledger.get_policy("demo_events_user").delta_cap == D6
    ledger.register_budget(new)  # now a no-op
    reserve(ledger, "r1", ZCDP("0.5", "1e-8"), budget="demo_events_user")
    ledger.verify()


def test_status_and_history_show_delta_and_epsilon(tmp_path):
    from dp_spark.ledger import open_ledger
    from dp_spark.cli.budget import budget_command

    pol = tmp_path / "budgets.yaml"
    pol.write_text(
        "version: 1\nbudgets:\n"
        "  z:\n    dataset: ds\n    privacy_unit: user\n    measure: zcdp\n    cap: {rho: 2}\n"
        "    statement_delta: 1.0e-7\n    delta_cap: 1.0e-6\n    window: monthly\n"
        "  nodelta:\n    dataset: ds3\n    privacy_unit: user\n    measure: zcdp\n    cap: {rho: 1}\n"
        "    statement_delta: 1.0e-7\n")
    from dp_spark.ledger.policy import load_policies

    pols = load_policies(pol)
    url = f"sqlite:{tmp_path / 'ledger.db'}"
    with open_ledger(url) as led:
        led.register_budget(pols["z"])
        led.register_budget(pols["nodelta"])
        led.reserve("z", "rel-1", ZCDP("0.5", "1e-8"), EVENT, principal="alice", code_version="v1",
                    release_family="fam", owner_token="o")
        led.commit("rel-1", "o")

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        rc = budget_command(list(argv), out=out, err=err)
        assert rc == 0, err.getvalue()
        return out.getvalue()

    out = run("status", "--ledger", url, "--policies", str(pol))
    block = out[out.index("budget z\n"):]  # budgets are listed by id: nodelta, then z
    from dp_spark.mechanisms.calibration import zcdp_to_approx_epsilon

    eps_spent = zcdp_to_approx_epsilon(Fraction(1, 2), Fraction(1, 10**7))
    assert "cap        rho=2, delta=1e-06 (epsilon=" in block
    assert f"spent      rho=0.5, delta=1e-08 (epsilon={eps_spent:.4g} at delta=1.1e-07)" in block
    assert "remaining  rho=1.5, delta=9.9e-07 (epsilon=" in block
    nodelta = out[out.index("budget nodelta"):out.index("budget z\n")]
    assert "cap        rho=1, delta=0 (epsilon=" in nodelta and "delta cap  0" in nodelta
    assert "`delta_cap:` in budgets.nodelta" in nodelta

    hist = run("history", "--budget", "z", "--ledger", url, "--policies", str(pol))
    assert "rel-1" in hist and f"rho=0.5, delta=1e-08 (epsilon={eps_spent:.4g} at delta=1.1e-07)" in hist

    js = json.loads(run("status", "--budget", "z", "--json", "--ledger", url, "--policies", str(pol)))[0]
    assert js["spent"] == {"measure": "zcdp", "rho": "1/2", "delta": "1/100000000"}
    assert (js["delta_cap"], js["delta_spent"], js["delta_remaining"]) == ("1/1000000", "1/100000000",
                                                                            "99/100000000")
    assert js["spent_as_epsilon_delta"]["epsilon"] == pytest.approx(eps_spent)
    assert js["spent_as_epsilon_delta"]["delta"] == pytest.approx(1.1e-7)
