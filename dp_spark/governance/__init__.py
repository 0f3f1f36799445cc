"""Governance beside the mechanism: who may release what, minimum group sizes, versions and
rollback, retention, and the generated privacy statement. See ``docs/governance.md``.

Where each piece sits in the release protocol (``Engine.publish``)::

    principal = resolve_principal(spark)                        # once, in Engine.__init__
    access    = access_policy_for_env(env)                      # once, in Engine.__init__
    authorize(access, principal, "publish", mode=mode, spec=spec, ledger=ledger)
                                                                # first thing, before any data
    ... reserve, bound, aggregate, QueryPlan.noise ...
    cells, suppressed = apply_min_group_size(cells, ...)        # driver, noisy cells only
    ... write release, ledger commit, audit ...
    after_official_release(spark, env=env, spec=spec, ...)      # official mode only: version +
                                                                # statement (also on cache hits)

and for an admin's rollback: :func:`rollback_family`.

The submodules ``access``, ``thresholds``, ``statement`` and ``retention`` import no pyspark;
``versions`` does (imported lazily here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from dp_spark.governance.access import (
    ACTIONS,
    PRINCIPAL_ENV,
    ROLES,
    AccessPolicy,
    access_policy_for_env,
    authorize,
    is_preregistered,
    load_access_policy,
    resolve_principal,
    resolve_principal_with_source,
)
from dp_spark.governance.retention import RETENTION, staging_area, sweep_stale
from dp_spark.governance.statement import (
    build_and_write_statement,
    privacy_statement,
    statement_markdown,
    write_statement,
)
from dp_spark.statistics.postprocess import (
    MinGroupSize,
    apply_min_group_size,
    count_statistic_for,
    min_group_size_from_dict,
    suppression_summary,
)

__all__ = [
    "ACTIONS",
    "PRINCIPAL_ENV",
    "RETENTION",
    "ROLES",
    "AccessPolicy",
    "MinGroupSize",
    "access_policy_for_env",
    "after_official_release",
    "after_official_releases",
    "apply_min_group_size",
    "authorize",
    "build_and_write_statement",
    "count_statistic_for",
    "is_preregistered",
    "load_access_policy",
    "min_group_size_from_dict",
    "privacy_statement",
    "resolve_principal",
    "resolve_principal_with_source",
    "rollback_family",
    "staging_area",
    "statement_dir",
    "statement_markdown",
    "suppression_summary",
    "sweep_stale",
    "write_statement",
]


def statement_dir(env: Any) -> Path:
    """Where the privacy statements of an env are written: ``<warehouse>/statements``."""
    return Path(env.warehouse) / "statements"


def _refresh_statement(spark, env: Any, family: str, ledger: Any, releases_dir: str | Path,
                       summaries: Optional[list[dict[str, Any]]] = None,
                       written: Optional[Mapping[str, dict[str, Any]]] = None) -> Path:
    """Rebuild and write the family's privacy statement; returns the .md path."""
    _, _, md = build_and_write_statement(
        spark, family=family, ledger=ledger, releases_dir=releases_dir,
        releases_path=f"{env.output_root}/{family}", out_dir=statement_dir(env), summaries=summaries,
        lease_seconds=getattr(env, "lease_seconds", None), written=written)
    return md


def after_official_release(spark, *, env: Any, family: str, release_id: str, principal: str, ledger: Any,
                           releases_dir: str | Path, write: bool = True,
                           series_key: Optional[str] = None,
                           written: Optional[Mapping[str, dict[str, Any]]] = None) -> tuple[int, Optional[Path]]:
    """Make ``release_id`` the current version of ``family`` (of its day ``series_key``, a day
    release of a series) and regenerate its statement.

    Call after the release write and the ledger commit of an OFFICIAL release, and also on a
    cache hit or a healed release (idempotent: it heals a crash between the commit and the
    versioning; a withdrawn release stays withdrawn). Returns (version number, statement .md
    path or None when ``write`` is False). ``written``: the summaries of releases this process
    wrote itself (:func:`~dp_spark.governance.statement.load_release_summaries`), not read back.
    """
    from dp_spark.governance.versions import adopt_published, published_path_for, record_publication

    adopt_published(ledger, spark, published_path_for(env.output_root))  # (once, from an older deployment)
    no = record_publication(ledger, family, release_id, principal, series_key=series_key)
    return no, _refresh_statement(spark, env, family, ledger, releases_dir, written=written) if write else None


def after_official_releases(spark, *, env: Any, releases: Sequence[tuple[str, ...]], principal: str, ledger: Any,
                            releases_dir: str | Path,
                            written: Optional[Mapping[str, dict[str, Any]]] = None) -> dict[str, Path]:
    """:func:`after_official_release` for a batch: every (family, release id[, series key]),
    in publication order, versioned in ONE ledger transaction, then one statement per family.
    Returns family -> .md path. ``written``: as there."""
    from dp_spark.background import alongside
    from dp_spark.governance.statement import load_release_summaries, summary_cache_dir
    from dp_spark.governance.versions import adopt_published, published_path_for, record_publications

    families = sorted({r[0] for r in releases})
    # the statements' release summaries depend on the release tables only (written before
    # this call): read them while the version records are written; on any failure there,
    # the statement reads them itself
    summaries: dict[str, list[dict[str, Any]]] = {}

    def read_summaries() -> None:
        try:
            for f in families:
                summaries[f] = load_release_summaries(spark, family=f, releases_path=f"{env.output_root}/{f}",
                                                      cache_dir=summary_cache_dir(statement_dir(env)),
                                                      written=written)
        except Exception:
            pass

    with alongside(read_summaries, name="dp_spark-statement-inputs"):
        adopt_published(ledger, spark, published_path_for(env.output_root))  # (once, from an older deployment)
        record_publications(ledger, releases, principal)
    return {family: _refresh_statement(spark, env, family, ledger, releases_dir, summaries.get(family), written)
            for family in families}


def rollback_family(spark, *, env: Any, family: str, principal: str, reason: str, ledger: Any,
                    access: AccessPolicy, write: bool = True,
                    series_key: Optional[str] = None) -> tuple[str, Optional[str]]:
    """An admin's rollback, end to end: permission (refusal audited), withdraw + restore in one
    ledger transaction, one audit row (decision ``withdrawn``, no charge: nothing is refunded), and the
    regenerated statement with the erratum. Returns (withdrawn id, restored id or None)."""
    from dp_spark.governance.versions import adopt_published, published_path_for, refresh_published, rollback

    authorize(access, principal, "rollback", ledger=ledger, spec_name=family)
    pub = published_path_for(env.output_root)
    adopt_published(ledger, spark, pub)  # (once, from an older deployment)
    withdrawn, restored = rollback(ledger, family, principal, reason, series_key=series_key)
    detail = {"family": family, "restored": restored, "reason": reason[:400],
              "refund": "none: the withdrawn release was published"}
    if series_key is not None:
        detail["day"] = series_key
    ledger.append_audit(principal=principal, action="rollback", spec_name=family, spec_version=None,
                        decision="withdrawn", release_id=withdrawn, charge_json=None, detail=detail)
    if write:
        _refresh_statement(spark, env, family, ledger, access.releases_dir)
    refresh_published(ledger, spark, pub)  # the derived table (a rollback is rare: no background task)
    return withdrawn, restored
