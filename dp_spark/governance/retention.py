"""Retention: intermediate data dies with its job; what the engine keeps, and for how long.

:func:`staging_area` gives a job a unique staging/checkpoint directory and deletes it when
the job ends, on success or on failure (exception, KeyboardInterrupt, SystemExit). A job
killed hard (SIGKILL, OOM killer, a lost node) cannot run any clean-up, so every new
staging area first sweeps abandoned ones older than ``stale_after`` seconds
(:func:`sweep_stale`); only directories carrying dp_spark's marker file are ever removed.

Intermediate data can hold raw rows (bounded per unit, but raw): it must not outlive the job.
The engine itself keeps partials only in driver memory (O(public keys) rows) and noisy values
only until the Delta write; staging is for steps that need disk (checkpoints of long lineages,
staging tables of external writers).

:data:`RETENTION` is the documented list of what the engine keeps; ``docs/governance.md``
renders it. Nothing here imports pyspark (a session is only touched if passed).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional

from dp_spark.errors import ConfigError

__all__ = ["RETENTION", "MARKER", "STAGING_DIRNAME", "staging_area", "sweep_stale", "staging_root"]

MARKER = ".dp_spark_staging"
STAGING_DIRNAME = "_staging"
DEFAULT_STALE_AFTER = 24 * 3600
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_DIR_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}-\d{8}T\d{6}Z-[0-9a-f]{12}$")

# What dp_spark keeps. "kept" is the default; every store is the deployer's to back up and
# to expire according to their own policy -- except where "never delete" says why not.
RETENTION: dict[str, dict[str, str]] = {
    "staging": {
        "what": "per-job staging and checkpoint directories (may hold bounded raw rows)",
        "where": "<warehouse>/_staging/<job>-<time>-<id>/",
        "kept": "until the job ends (success or failure); abandoned ones are swept after 24 hours",
        "why": "intermediate data is not a release: it must not outlive the job",
    },
    "release_tables": {
        "what": "official release tables: noisy values, intervals and DP metadata per cell",
        "where": "<output_root>/<family>/ (Delta)",
        "kept": "indefinitely (they are the publication); withdrawn versions stay for the history",
        "why": "published statistics are public; deleting them cannot undo a release that was seen",
    },
    "exploration_tables": {
        "what": "exploration releases (noisy, marked mode=exploration, never published)",
        "where": "<exploration_root>/<family>/ (Delta)",
        "kept": "indefinitely by default; the deployer may expire them (Delta VACUUM after a DELETE)",
        "why": "they are noisy outputs already seen by analysts; keeping them lets reruns be cache hits "
               "instead of new charges",
    },
    "versions": {
        "what": "versions of each release family: current, superseded, withdrawn, with reasons",
        "where": "ledger_url (table dp_versions); a derived copy in <output_root>/_published (Delta)",
        "kept": "never delete",
        "why": "the published view and the errata of the privacy statement are derived from it",
    },
    "ledger": {
        "what": "budget ledger: charges per release, states, principals, code versions (no data values)",
        "where": "ledger_url (SQLite file or PostgreSQL)",
        "kept": "never delete",
        "why": "privacy loss does not expire mathematically: the record of what was spent must outlive "
               "every window; deleting entries would silently re-open budget",
    },
    "audit": {
        "what": "audit log: who, which spec and version, decision, charge, release id, time (no data values)",
        "where": "the ledger database (dp_audit), hash-chained",
        "kept": "never delete",
        "why": "accountability for every request, allowed or refused",
    },
    "mirrors": {
        "what": "Delta copies of the ledger and audit log for Spark SQL",
        "where": "ledger_mirror, audit_mirror (Delta, overwritten on each refresh)",
        "kept": "latest copy only (Delta time travel keeps older versions until VACUUM)",
        "why": "a read-only convenience; the SQL ledger is the authority",
    },
    "summaries": {
        "what": "per-release summaries and per-family privacy statements (Markdown and JSON)",
        "where": "<warehouse>/summaries/, <warehouse>/statements/",
        "kept": "regenerated on each publish or rollback; old files are overwritten",
        "why": "generated from the specs, ledger and tables, so they can always be rebuilt",
    },
    "input_data": {
        "what": "the raw input tables",
        "where": "the env's datasets (owned by their data owners)",
        "kept": "not managed by dp_spark; releases pin an input version, so the owner's VACUUM policy "
                "decides how long a release can be recomputed",
        "why": "dp_spark reads raw data, it does not hold copies of it outside staging",
    },
    "salt": {
        "what": "secret salt of the bottom-K sampling priority",
        "where": "salt_file (0600)",
        "kept": "for the life of the warehouse",
        "why": "rotating it changes which rows are kept: a rerun would no longer be the same release",
    },
}


def staging_root(env_or_dir: Any) -> Path:
    """``<warehouse>/_staging`` for an EnvConfig, or the given directory itself."""
    if hasattr(env_or_dir, "warehouse"):
        return Path(env_or_dir.warehouse) / STAGING_DIRNAME
    if isinstance(env_or_dir, (str, os.PathLike)):
        return Path(env_or_dir)
    raise ConfigError("staging_area needs an EnvConfig or a directory")


def sweep_stale(root: str | os.PathLike, stale_after: float = DEFAULT_STALE_AFTER,
                now: Optional[float] = None) -> list[Path]:
    """Delete staging directories under ``root`` left by jobs that were killed: only
    directories named like a staging area that carry the marker file and whose marker is
    older than ``stale_after`` seconds. Returns what was removed."""
    root = Path(root)
    if not root.is_dir():
        return []
    t = time.time() if now is None else now
    removed = []
    for d in root.iterdir():
        marker = d / MARKER
        try:
            if d.is_dir() and not d.is_symlink() and _DIR_RE.match(d.name) and marker.is_file() \
                    and t - marker.stat().st_mtime > stale_after:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
        except OSError:
            continue
    return removed


@contextmanager
def staging_area(env_or_dir: Any, *, job: str = "job", spark=None,
                 stale_after: float = DEFAULT_STALE_AFTER) -> Iterator[Path]:
    """A unique, private (0700) staging directory for one job, deleted when the block exits.

    ``with staging_area(env, job="publish") as tmp: ...`` -- ``tmp`` is
    ``<warehouse>/_staging/<job>-<UTC time>-<random>``; with ``spark`` given, its
    ``checkpoints`` subfolder becomes the session's checkpoint directory for the block (the
    previous one, if readable, is restored). Deletion happens on success and on failure;
    the exception is re-raised unchanged.
    """
    if not isinstance(job, str) or not _NAME_RE.match(job):
        raise ConfigError("job must be 1-64 characters of letters, digits, '_' and '-'")
    root = staging_root(env_or_dir)
    root.mkdir(parents=True, exist_ok=True)
    sweep_stale(root, stale_after)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = root / f"{job}-{stamp}-{uuid.uuid4().hex[:12]}"
    path.mkdir(mode=0o700)
    (path / MARKER).write_text(f"pid={os.getpid()}\n")
    previous_checkpoint = None
    if spark is not None:
        (path / "checkpoints").mkdir()
        try:
            sc = spark.sparkContext
            previous_checkpoint = sc.getCheckpointDir()
            sc.setCheckpointDir(str(path / "checkpoints"))
        except Exception:  # Spark Connect: no SparkContext checkpoints
            pass
    try:
        yield path
    finally:
        if spark is not None:
            try:
                if previous_checkpoint:
                    spark.sparkContext.setCheckpointDir(previous_checkpoint)
            except Exception:
                pass
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():  # e.g. a file made read-only by the job: retry after chmod
            for p in sorted(path.rglob("*"), reverse=True):
                try:
                    os.chmod(p, 0o700)
                except OSError:
                    pass
            shutil.rmtree(path, ignore_errors=True)
