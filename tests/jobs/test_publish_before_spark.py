"""``dp-spark publish`` refuses before any Spark session starts what no session could change
(:meth:`dp_spark.commands.Checker.refuse_before_spark`), with the message and audit row it
would give later, and leaves nothing behind; it does not refuse early what a session could
still serve (a cache hit of a family already charged, ``on_exhausted`` other than reject) nor
judge a principal only the platform knows.

No Spark here: the engine is replaced by one that fails the test if it is built (the refusals
must come first), or records that it was built (the cases left to the engine).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from dp_spark import commands
from dp_spark.commands import BatchRefusedError, checker, publish_batch
from dp_spark.config import load_env, load_release_spec
from dp_spark.core.budget import ZCDP
from dp_spark.errors import BudgetExceededError, DpSparkError, PermissionDeniedError
from dp_spark.ledger import open_ledger
from dp_spark.ledger.policy import load_policies

from .conftest import ROOT, write_env

DAU = ROOT / "conf/releases/dau_daily.yaml"


class _EngineBuilt(Exception):
    pass


@pytest.fixture
def env_file(tmp_path, monkeypatch):
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "publisher_bob")
    return write_env(tmp_path)


@pytest.fixture
def engine_built(monkeypatch):
    """``dp_spark.engine.Engine`` replaced: building it raises :class:`_EngineBuilt`."""
    import dp_spark.engine

    def built(*a, **kw):
        raise _EngineBuilt()

    monkeypatch.setattr(dp_spark.engine, "Engine", built)


def _spend(env, family: str, rho: str) -> None:
    """A charge of ``rho`` on demo_events_user by a release of ``family`` (committed)."""
    policy = load_policies(env.policies)["demo_events_user"]
    with open_ledger(env.ledger_url) as led:
        led.register_budget(policy)
        whole, rest = divmod(Fraction(rho), 1)  # in charges of at most the per-release maximum (rho 1)
        parts = [Fraction(1)] * int(whole) + ([rest] if rest else [])
        for n, part in enumerate(parts):
            r = led.reserve("demo_events_user", f"r-{family}-{n}", ZCDP(part), "{}", principal="publisher_bob",
                            code_version="v", release_family=family, owner_token="o")
            led.commit(r.entry.release_id, "o")


def _registered(env_file) -> Path:
    """The env's pre-registered copy of the shipped dau_daily spec."""
    return Path(env_file).parents[1] / "releases" / "dau_daily.yaml"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_an_exhausted_budget_is_refused_before_spark_with_validate_s_message(env_file, engine_built):
    env = load_env(env_file)
    _spend(env, "other_family", "1.9")  # 0.1 of the cap 2 left; dau_daily charges 0.25
    spec = load_release_spec(_registered(env_file))
    with pytest.raises(BudgetExceededError) as by_validate:
        checker(env, mode="official").check(spec)
    before = _files(Path(env.warehouse))
    batch = publish_batch(env, [spec])  # the engine is never built: no Spark session
    [outcome] = batch.outcomes
    assert outcome.result is None and outcome.error == str(by_validate.value) and batch.failed == 1
    assert _files(Path(env.warehouse)) == before  # nothing created (the ledger already existed)
    with open_ledger(env.ledger_url) as led:  # audited as publish audits it
        [row] = [a for a in led.audit_rows() if a.decision == "refused_budget"]
    assert (row.spec_name, row.action, row.principal) == ("dau_daily", "publish:official", "publisher_bob")


def test_in_a_batch_the_spec_the_budget_cannot_pay_fails_and_the_others_are_published(env_file, engine_built):
    """As at the reservation: one failure does not stop the others (the session starts for them)."""
    env = load_env(env_file)
    _spend(env, "other_family", "1.9")
    d = yaml.safe_load(_registered(env_file).read_text())
    d.update(name="dau_small", family="dau_small")
    d["budget"]["rho"] = 0.05  # fits the 0.1 left
    small = Path(env_file).parents[1] / "releases" / "dau_small.yaml"
    small.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(_EngineBuilt):  # built for dau_small
        publish_batch(env, [load_release_spec(_registered(env_file)), load_release_spec(small)])


def test_a_declared_principal_not_allowed_is_refused_before_spark_and_audited(env_file, engine_built,
                                                                              monkeypatch):
    monkeypatch.setenv("DP_SPARK_PRINCIPAL", "mallory")
    env = load_env(env_file)
    spec = load_release_spec(_registered(env_file))
    with pytest.raises(PermissionDeniedError) as by_validate:
        checker(env, mode="official").check(spec)
    with pytest.raises(BatchRefusedError) as refused:
        publish_batch(env, [spec])
    [(_, why)] = refused.value.refused
    assert isinstance(why, PermissionDeniedError) and str(why) == str(by_validate.value)
    with open_ledger(env.ledger_url) as led:
        [row] = [a for a in led.audit_rows() if a.decision == "refused_permission"]
    assert row.spec_name == "dau_daily"
    assert not (Path(env.output_root)).exists() or not any(Path(env.output_root).iterdir())


def test_a_charge_over_the_per_release_maximum_is_refused_before_spark_creating_nothing(env_file, engine_built):
    env = load_env(env_file)
    d = yaml.safe_load(DAU.read_text())
    d.update(name="dau_big", family="dau_big")
    d["budget"]["rho"] = 1.5  # the budget's max_per_release is 1
    spec_path = Path(env_file).parents[1] / "releases" / "dau_big.yaml"
    spec_path.write_text(yaml.safe_dump(d, sort_keys=False))
    spec = load_release_spec(spec_path)
    with pytest.raises(DpSparkError) as by_validate:
        checker(env, mode="official").check(spec)
    with pytest.raises(BatchRefusedError) as refused:
        publish_batch(env, [spec])
    [(_, why)] = refused.value.refused
    assert type(why) is type(by_validate.value) and str(why) == str(by_validate.value)
    assert _files(Path(env.warehouse)) == set()  # a fresh machine: not even a ledger file


@pytest.mark.parametrize("case", ["family_charged_before", "return_existing", "platform_principal"])
def test_what_a_session_could_still_serve_is_left_to_the_engine(env_file, engine_built, monkeypatch, case):
    """The refusal would be wrong before Spark: a rerun of the family's release is a cache hit
    (served though the budget is spent); ``return_existing`` serves the latest release; the
    principal of a job that does not declare one is the platform's (the Spark user)."""
    env = load_env(env_file)
    spec = load_release_spec(_registered(env_file))
    if case == "family_charged_before":
        _spend(env, "dau_daily", "1.9")
    elif case == "return_existing":
        _spend(env, "other_family", "1.9")
        d = yaml.safe_load(DAU.read_text())
        d.update(on_exhausted="return_existing")
        p = Path(env_file).parents[1] / "releases" / "dau_daily.yaml"
        p.write_text(yaml.safe_dump(d, sort_keys=False))
        spec = load_release_spec(p)
    else:
        monkeypatch.delenv("DP_SPARK_PRINCIPAL")
        monkeypatch.setattr(commands, "resolve_principal_with_source", lambda *a, **kw: ("mallory", "os"))
    with pytest.raises(_EngineBuilt):
        publish_batch(env, [spec])
    if case != "platform_principal":
        with open_ledger(env.ledger_url) as led:
            assert not [a for a in led.audit_rows() if a.decision.startswith("refused")]
