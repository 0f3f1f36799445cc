"""A SparkSession with Delta Lake, for jobs, notebooks and tests.

:func:`get_or_create_session` never reconfigures a session somebody else owns:

* a session is already active (Databricks notebook, ``pyspark`` shell, a test fixture,
  Spark Connect) -> it is returned untouched;
* this Python process was started by ``spark-submit`` (the JVM already runs with the
  launcher's ``--master``/``--jars``/``--conf``) -> a session is created on that JVM; only the
  settings the launcher left unset get our defaults, ``spark.master`` and ``spark.jars`` are
  never overridden (pass ``--jars $(python -c 'from dp_spark.spark import delta_jar_paths;
  print(",".join(delta_jar_paths()))')`` to ``spark-submit``);
* ``remote`` (or a ``master`` of the form ``sc://host:port``) names a Spark Connect server ->
  a Connect session to it is returned (the server owns the Delta configuration; ``extra_conf``
  is sent as session settings, the static ones are ignored by the server);
* otherwise a new session is built: ``local[2]`` unless ``master`` says otherwise, the Delta
  jars from ``$DP_SPARK_JARS_DIR`` or ``<repo>/.jars`` (``make jars`` fills it; Ivy /
  ``spark.jars.packages`` is not used), the Delta SQL extension and catalog, UTC session time
  zone and small-machine settings for local masters.

``extra_conf`` is applied last and wins over the defaults (e.g. ``spark.driver.memory``, which
only takes effect when this call starts the JVM).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkConf
from pyspark.sql import SparkSession

from dp_spark.errors import ConfigError

__all__ = [
    "CONNECT_SCHEME",
    "DEFAULT_MASTER",
    "JARS_DIR_ENV",
    "delta_jar_paths",
    "get_or_create_session",
    "is_connect_session",
    "jars_dir",
    "log4j2_file",
]

DEFAULT_MASTER = "local[2]"
#: a master URL with this prefix is a Spark Connect server (``sc://host:port``)
CONNECT_SCHEME = "sc://"
JARS_DIR_ENV = "DP_SPARK_JARS_DIR"

_DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
_DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

# Applied to every session this module creates (unless already set by a launcher).
_COMMON_DEFAULTS: dict[str, str] = {
    "spark.sql.extensions": _DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": _DELTA_CATALOG,
    "spark.sql.session.timeZone": "UTC",
    # pyspark's DataFrame debugging (on by default) records the Python call site of every
    # Column function in the JVM: about ten py4j round trips around each F.col, F.lit or cast
    # (a daily refresh made ~1,000 of them building one release). The engine never shows a
    # Spark error's text after a charge anyway (errors carry the class, not the query context)
    "spark.python.sql.dataFrameDebugging.enabled": "false",
}

# Only for local[*] masters: a laptop / CI runner with a couple of cores.
_LOCAL_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.databricks.delta.snapshotPartitions": "2",
    # The status store keeps jobs, stages, tasks and SQL executions (with their plan graphs)
    # even with the UI off: ~35 executions per release, so a driver publishing release after
    # release grew its live heap until the defaults' caps (1,000 / 1,000 / 100,000 / 1,000)
    # and then paid their trimming (issue 15, "no drift"; docs/performance.md).
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "10000",
    "spark.sql.ui.retainedExecutions": "50",
    "spark.ui.dagGraph.retainedRootRDDs": "100",
}


#: log4j2 configuration of a JVM this module launches: Spark's console defaults (WARN and up
#: to stderr), except the loggers that print a failed task's exception text, which can carry a
#: row's values (RELIABILITY 23: a failure's text must not reach the user). A job's failure is
#: still reported: the engine raises ReleaseFailedError (release id, stage, exception class).
#: On a cluster the executors log on the workers, to the operators' logs (docs/deploy.md).
LOG4J2_PROPERTIES = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
""" + "".join(
    f"logger.quiet{i}.name = {name}\nlogger.quiet{i}.level = off\n" for i, name in enumerate((
        "org.apache.spark.executor.Executor",
        "org.apache.spark.scheduler.TaskSetManager",
        "org.apache.spark.scheduler.TaskSchedulerImpl",
        "org.apache.spark.scheduler.DAGScheduler",
        "org.apache.spark.api.python",
        "org.apache.spark.sql.execution.python",
        "org.apache.spark.sql.execution.datasources",
        "org.apache.spark.util.Utils",
    )))

#: pyspark's own Python loggers that print a Spark exception's full text when it is raised
PYSPARK_ERROR_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@contextmanager
def quiet_pyspark_error_logs() -> Iterator[None]:
    """Hold pyspark's exception loggers (:data:`PYSPARK_ERROR_LOGGERS`) silent: they print a
    Spark exception's text, which can carry a row's values, as the exception is raised. The
    loggers are pyspark's own (PySparkLogger: a plain ``logging.Logger`` of that name would
    break pyspark's calls); their levels are restored on leaving."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # a pyspark without these loggers
        yield
        return
    quiet = [PySparkLogger.getLogger(name) for name in PYSPARK_ERROR_LOGGERS]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)


def log4j2_file() -> str:
    """The log4j2 file of :data:`LOG4J2_PROPERTIES` in the temp directory, named by its
    content (written once, atomically); its root level is ``$DP_SPARK_JVM_LOG_LEVEL`` when set
    (the CLI's default: error)."""
    import hashlib
    import tempfile

    from dp_spark.env_file import JVM_LOG_LEVEL_ENV

    level = os.environ.get(JVM_LOG_LEVEL_ENV, "").strip().lower()
    text = LOG4J2_PROPERTIES
    if level in ("error", "warn", "info", "debug", "off"):
        text = text.replace("rootLogger.level = warn", f"rootLogger.level = {level}", 1)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"dp_spark-log4j2-{digest}.properties"
    if not path.exists() or path.read_text() != text:
        fd, tmp = tempfile.mkstemp(prefix="dp_spark-log4j2-", dir=path.parent)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    return str(path)


def jars_dir() -> Path:
    """The directory holding the Delta jars: ``$DP_SPARK_JARS_DIR`` or ``<repo root>/.jars``.

    The repo root is the parent directory of the ``dp_spark`` package.
    """
    configured = os.environ.get(JARS_DIR_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path(__file__).resolve().parent.parent / ".jars"


def delta_jar_paths() -> list[str]:
    """Absolute paths of every jar in :func:`jars_dir`, sorted (for ``spark-submit --jars``).

    Raises :class:`~dp_spark.errors.ConfigError` when the directory is missing or holds no
    ``delta-spark`` jar.
    """
    directory = jars_dir()
    if not directory.is_dir():
        raise ConfigError(
            f"Delta jar directory {str(directory)!r} does not exist; run `make jars` "
            f"(or set {JARS_DIR_ENV} to a directory holding the delta-spark jars)"
        )
    jars = sorted(str(p) for p in directory.iterdir() if p.is_file() and p.suffix == ".jar")
    if not any(Path(j).name.startswith("delta-spark") for j in jars):
        raise ConfigError(
            f"no delta-spark jar in {str(directory)!r}; run `make jars` "
            f"(or set {JARS_DIR_ENV} to a directory holding the delta-spark jars)"
        )
    return jars


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def _existing_session() -> SparkSession | None:
    """A session somebody else created, or None. Never creates a JVM."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    default = getattr(SparkSession, "_instantiatedSession", None)
    if default is not None and getattr(getattr(default, "_sc", None), "_jsc", None) is not None:
        return default
    # Spark Connect: the server owns the configuration; the builder only connects.
    if "SPARK_REMOTE" in os.environ or "SPARK_CONNECT_MODE_ENABLED" in os.environ:
        return SparkSession.builder.getOrCreate()
    try:
        from pyspark import SparkContext
    except ImportError:  # pyspark-connect only distribution
        return None
    if SparkContext._active_spark_context is not None:
        # A SparkContext without a session: wrap it, do not reconfigure it.
        return SparkSession.builder.getOrCreate()
    return None


def is_connect_session(spark) -> bool:
    """True for a Spark Connect session (no JVM gateway, no SparkContext in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def get_or_create_session(
    app_name: str = "dp_spark",
    *,
    master: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    remote: str | None = None,
) -> SparkSession:
    """Return the active SparkSession, or build one configured for Delta Lake.

    Parameters
    ----------
    app_name:
        Application name of a newly built session (ignored for an existing one).
    master:
        Master URL of a newly built session; default ``local[2]``. Ignored when a session
        exists or when ``spark-submit`` already chose the master.
    extra_conf:
        Extra Spark settings, applied after (and overriding) the defaults of a new session.
    remote:
        A Spark Connect URL (``sc://host:port``): connect to that server instead of building a
        local JVM (nothing of this module's JVM defaults applies; the server owns them). A
        ``master`` starting with ``sc://`` means the same.

    Raises
    ------
    ConfigError
        When a session must be built here and no ``delta-spark`` jar can be found.
    """
    existing = _existing_session()
    if existing is not None:
        return existing

    extra = {str(k): str(v) for k, v in (extra_conf or {}).items()}
    builder = SparkSession.builder

    if remote is None and master is not None and master.startswith(CONNECT_SCHEME):
        remote = master
    if remote is not None:
        # Spark Connect: no JVM here; the settings travel as session settings (the server
        # ignores the static ones silently)
        builder = builder.remote(remote).appName(app_name)
        for key, value in extra.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Launched by spark-submit: the JVM already runs with the launcher's conf. Connect to
        # it first (no SparkContext yet) so that SparkConf() reads the JVM's spark.* system
        # properties, then fill in only what the launcher left unset.
        from pyspark import SparkContext

        SparkContext._ensure_initialized()
        launcher_conf = SparkConf()
        resolved_master = launcher_conf.get("spark.master", DEFAULT_MASTER) or DEFAULT_MASTER
        defaults = dict(_COMMON_DEFAULTS)
        if _is_local(resolved_master):
            defaults.update(_LOCAL_DEFAULTS)
        if not launcher_conf.contains("spark.app.name"):  # keep the launcher's --name
            builder = builder.appName(app_name)
        for key, value in defaults.items():
            if not launcher_conf.contains(key):
                builder = builder.config(key, value)
        for key, value in extra.items():
            builder = builder.config(key, value)
        return builder.getOrCreate()

    builder = builder.appName(app_name)
    resolved_master = master or DEFAULT_MASTER
    conf: dict[str, str] = {"spark.master": resolved_master, **_COMMON_DEFAULTS}
    conf["spark.jars"] = ",".join(delta_jar_paths())
    if _is_local(resolved_master):
        conf.update(_LOCAL_DEFAULTS)
        # Loopback unless the user pinned an address: no DNS, no firewall prompts.
        local_ip = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        conf["spark.driver.host"] = local_ip
        conf["spark.driver.bindAddress"] = local_ip
    # the JVM starts here: its console log withholds failed tasks' texts (LOG4J2_PROPERTIES)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j2_file()}"
    conf.update(extra)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
