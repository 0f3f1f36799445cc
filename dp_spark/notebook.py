"""What the notebooks need to feel at home on Databricks and still run as plain scripts.

::

    from dp_spark.notebook import Notebook

    nb = Notebook(globals(), root=ROOT)          # finds dbutils / display when Databricks injected them
    ENV_FILE = nb.widget("env", nb.default_env(), "Environment file", env_var="DP_SPARK_ENV")
    nb.show(pandas_or_spark_df, "the published cells")   # display() on Databricks, print locally
    nb.figure(fig, out_dir / "chart.png")         # inline on Databricks, a PNG file when it can write one

On Databricks (``dbutils`` in the notebook's globals) :meth:`Notebook.widget` creates a widget
(text, dropdown or multiselect) and returns its value; elsewhere it returns the environment
variable ``env_var`` when set, else the default, and creates nothing. :meth:`Notebook.show`
and :meth:`Notebook.figure` use the notebook's ``display`` when there is one (Databricks
renders Spark and pandas DataFrames as tables and matplotlib figures inline) and fall back to
``print`` and PNG files. :meth:`Notebook.output_dir` is where a notebook may write files: the
env's warehouse, never the repository (refused on Databricks, where the repository is a Git
folder of the workspace). Nothing here imports pyspark.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

__all__ = ["Notebook", "on_databricks"]


def on_databricks(namespace: Optional[Mapping[str, Any]] = None) -> bool:
    """True in a Databricks notebook or job: ``dbutils`` is in ``namespace`` or the runtime's
    ``DATABRICKS_RUNTIME_VERSION`` is set."""
    return bool((namespace or {}).get("dbutils") is not None or os.environ.get("DATABRICKS_RUNTIME_VERSION"))


class Notebook:
    """The notebook's own ``dbutils`` and ``display`` when Databricks provides them, with local
    fallbacks. ``namespace`` is the notebook's ``globals()``; ``root`` the repository root
    (relative widget paths resolve against it)."""

    def __init__(self, namespace: Mapping[str, Any], *, root: Optional[Path] = None) -> None:
        self.dbutils = namespace.get("dbutils")
        display = namespace.get("display")
        self._display = display if callable(display) else None
        self.on_databricks = on_databricks(namespace)
        self.root = Path(root).resolve() if root is not None else None
        self.shown: list[tuple[str, Any]] = []  # (title, object) of every show/figure, for tests

    # ---------------------------------------------------------------- widgets
    def widget(self, name: str, default: str, label: str = "", *, choices: Optional[Sequence[str]] = None,
               env_var: Optional[str] = None) -> str:
        """The widget's value on Databricks (the widget is created, so that it shows at the top
        of the notebook; a job's parameter of that name sets its value); else ``$env_var`` when
        set, else ``default``.

        ``choices`` makes a dropdown (``default`` must be one of them); otherwise a text widget
        (several values: comma-separated, see :meth:`values`).
        """
        if self.dbutils is not None:
            w = self.dbutils.widgets
            # creating an existing widget keeps it; a job's parameter of that name is what get() returns
            if choices:
                w.dropdown(name, default, list(choices), label or name)
            else:
                w.text(name, default, label or name)
            return w.get(name)
        if env_var and os.environ.get(env_var):
            return os.environ[env_var]
        return default

    @staticmethod
    def values(value: str) -> list[str]:
        """A comma-separated widget value as a list (blanks dropped)."""
        return [v.strip() for v in value.split(",") if v.strip()]

    def path(self, value: str) -> Path:
        """A widget's path: absolute as given, else relative to the repository root."""
        p = Path(value).expanduser()
        return p if p.is_absolute() or self.root is None else self.root / p

    def default_env(self) -> str:
        """``conf/envs/databricks.yaml`` on Databricks when the repository has it, else
        ``conf/envs/local.yaml`` (relative to the repository root)."""
        if self.on_databricks and self.root is not None and (self.root / "conf/envs/databricks.yaml").is_file():
            return "conf/envs/databricks.yaml"
        return "conf/envs/local.yaml"

    # ---------------------------------------------------------------- output
    def show(self, obj: Any, title: str = "", *, max_rows: int = 40) -> None:
        """``display(obj)`` on Databricks; else print ``title`` and the table (pandas, a Spark
        DataFrame's first ``max_rows`` rows, or a list of dicts)."""
        self.shown.append((title, obj))
        if title:
            print(title)
        if self._display is not None:
            self._display(obj)
            return
        import pandas as pd

        if hasattr(obj, "toPandas") and hasattr(obj, "limit"):  # a Spark DataFrame
            obj = obj.limit(max_rows).toPandas()
        if isinstance(obj, (list, tuple)):
            obj = pd.DataFrame(list(obj))
        if isinstance(obj, pd.DataFrame):
            with pd.option_context("display.width", 200, "display.max_columns", 20):
                print(obj.head(max_rows).to_string(index=False))
                if len(obj) > max_rows:
                    print(f"... {len(obj) - max_rows} more rows")
        else:
            print(obj)

    def figure(self, fig: Any, path: Optional[str | os.PathLike] = None, title: str = "") -> Optional[str]:
        """Show a matplotlib figure inline on Databricks and, when ``path`` is a local (or
        ``/dbfs``, ``/Volumes``) path, save it there as PNG. Returns the file written, if any."""
        self.shown.append((title, fig))
        if self._display is not None:
            self._display(fig)
        if path is None:
            return None
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, format="png")
        print(f"{title + ': ' if title else ''}chart written to {p}")
        return str(p)

    def output_dir(self, env: Any, *parts: str) -> Optional[Path]:
        """A folder under the env's warehouse for files (charts), or None when the warehouse
        is not a file system path this process can write (an object-store URL: then charts
        are only displayed). ``dbfs:/x`` maps to ``/dbfs/x``. On Databricks a warehouse inside
        the repository is refused: outputs never go to the repo folder."""
        wh = str(env.warehouse)
        if wh.startswith("dbfs:/"):
            wh = "/dbfs/" + wh[len("dbfs:/"):].lstrip("/")
        elif "://" in wh or wh.startswith(("s3:", "abfss:", "gs:")):
            return None
        out = Path(wh).joinpath(*parts)
        if self.on_databricks and self.root is not None:
            try:
                out.resolve().relative_to(self.root)
            except ValueError:
                pass
            else:
                from dp_spark.errors import ConfigError

                raise ConfigError(f"the env's warehouse {env.warehouse} is inside the repository {self.root}: "
                                  "on Databricks use an env whose warehouse is a catalog, a volume or DBFS "
                                  "(conf/envs/databricks.yaml)")
        return out
