"""Build the API reference of dp_spark from its docstrings, with pdoc.

    python docs/build_api.py [OUT_DIR]        # default: build/api (not committed)

Writes one HTML page per public module (``dp_spark/x/y.py`` -> ``OUT_DIR/dp_spark/x/y.html``)
and ``index.html``. Exits 1, naming them, when a public module has no docstring: every module
a reader can import is documented. Private modules (a name starting with ``_``) are skipped.
Imports every module (pyspark included), reads no data and starts no Spark session.
Needs ``pdoc`` (``pip install -e '.[docs]'``; the ``test`` extra has it too).
"""

from __future__ import annotations

import ast
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dp_spark"


def public_modules(root: Path = ROOT) -> list[str]:
    """Dotted names of the package's public modules (packages included), sorted."""
    names = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(p.startswith("_") for p in parts):
            continue
        names.append(".".join(parts))
    return names


def module_file(name: str, root: Path = ROOT) -> Path:
    base = root.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def undocumented(root: Path = ROOT) -> list[str]:
    """Public modules whose source has no module docstring."""
    return [n for n in public_modules(root)
            if not (ast.get_docstring(ast.parse(module_file(n, root).read_text())) or "").strip()]


def build(out: Path, root: Path = ROOT) -> list[Path]:
    """Render every public module into ``out``; returns the HTML pages written."""
    import pdoc
    import pdoc.render

    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    pdoc.render.configure(docformat="restructuredtext", show_source=False,
                          footer_text=f"{PACKAGE}: API reference generated from the docstrings")
    with warnings.catch_warnings():
        # dp_spark.evaluation's __all__ names lazily imported functions (module __getattr__),
        # which pdoc reports as unresolved; their own modules' pages document them
        warnings.filterwarnings("ignore", message=r"Found '.*' in dp_spark\.evaluation\.__all__")
        # a package's __all__ hides its submodules from pdoc's recursion: name every module
        warnings.filterwarnings("ignore", message=r"The module specification .* adds a module named")
        pdoc.pdoc(*public_modules(root), output_directory=out)
    return sorted(out.rglob("*.html"))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else ROOT / "build" / "api"
    missing = undocumented()
    if missing:
        print("modules without a docstring: " + ", ".join(missing), file=sys.stderr)
        return 1
    pages = build(out)
    print(f"wrote {len(pages)} pages under {out} ({out / 'index.html'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
