"""The actions of one Delta commit, read from the table's log without a Spark job.

:func:`commit_actions` returns them as the log stores them: one single-key dict per action
(``{"commitInfo": {...}}``, ``{"txn": {"appId": ..., "version": ...}}``, ``{"add": {...}}``...).
A local table's commit file (``_delta_log/<version>.json``) is read directly; otherwise, or
when that file cannot be read, the commit is read through Delta's ``DeltaLog.getChanges`` over
the JVM gateway (an internal Delta API, called with its Delta 4.4 and its Delta 4.0
signature). Delta writes each action read that way back as JSON; an action it does not write
back as valid JSON is left out: Delta 4.0 writes a ``commitInfo``'s ``operationParameters``
unquoted, so there the list has no ``commitInfo`` (a caller needing it falls back when it is
absent). None when neither works (Spark Connect, no such commit, any failure): callers take
that as "not known" and fall back to a read of their own, or treat it as a miss.

Imports no pyspark at module level.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

__all__ = ["commit_actions"]


def commit_actions(spark, path: str, version: int) -> Optional[list[dict[str, Any]]]:
    """The actions of Delta commit ``version`` of the path table ``path`` (see the module
    docstring), or None when they cannot be read. Never raises."""
    actions = _file_actions(path, version)
    return actions if actions is not None else _log_actions(spark, path, version)


def _file_actions(path: str, version: int) -> Optional[list[dict[str, Any]]]:
    """The commit file's actions when ``path`` is local (no scheme, or ``file:``), else None."""
    local = path[len("file:"):] if path.startswith("file:") else path
    if "://" in local:
        return None
    try:
        with open(os.path.join(local, "_delta_log", f"{version:020d}.json"), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except Exception:
        return None


def _log_actions(spark, path: str, version: int) -> Optional[list[dict[str, Any]]]:
    """The commit's actions through ``DeltaLog.getChanges`` (classic Spark only), or None."""
    try:
        from dp_spark.spark import is_connect_session

        if is_connect_session(spark):
            return None  # a Connect session has no JVM gateway: never touch its classic attributes
        from dp_spark.release.writer import _delta_log

        jvm = spark._jvm
        delta_log = _delta_log(spark, path)
        try:  # Delta 4.4: (start, end, catalog table, failOnDataLoss)
            changes = delta_log.getChanges(version, version, jvm.scala.Option.empty(), False)
        except Exception:  # Delta 4.0: (start, failOnDataLoss), up to the latest version
            changes = delta_log.getChanges(version, False)
        if not changes.hasNext():
            return None
        change = changes.next()
        if int(change._1()) != version:  # that commit is gone (failOnDataLoss off)
            return None
        out = []
        actions = change._2().iterator()
        while actions.hasNext():
            try:
                out.append(json.loads(actions.next().json()))
            except ValueError:  # not written back as valid JSON (Delta 4.0's commitInfo): left out
                continue
        return out
    except Exception:
        return None
