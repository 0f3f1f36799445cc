"""What a deployment still has to change: the placeholders left in its configuration.

The shipped Databricks configuration (``conf/envs/databricks.yaml``, ``databricks.yml``,
``conf/policies/access.yaml``) cannot know a workspace's hosts, tables, volumes or service
principal. Every value a deployer must replace carries a trailing comment::

    ledger_url: postgresql://dp_spark@ledger.internal.example.com:5432/...  # PLACEHOLDER: your ledger's host

In the env file itself the comment is ``# PLACEHOLDER: <what to put there>``; in a file shared
by several envs (the access policy, the bundle) it names the env it belongs to,
``# PLACEHOLDER(databricks): ...``, so that the ``local`` env is never told to change the
Databricks principal. Removing the comment after replacing the value is the deployer's "done".

:func:`env_placeholders` lists, for an env, every marked value still present in the env file,
in the access policy beside its budget policies (``access.yaml``) and the budget policies
themselves, and in the project's ``databricks.yml`` when it names the env file, with the file,
the line, the field path and what to put there; plus a ledger URL whose host is a reserved
example name (``example.com``, ``.example``, ``.invalid``, ``.test``: RFC 2606), marked or not.

``python -m dp_spark.deploy_check --env conf/envs/databricks.yaml`` prints them (exit 1 while
any is left, 0 when none); docs/deploy.md, "Before the first deploy", is the same list in prose.
Reads text files only: no Spark, no ledger, no network, nothing imported from the engine.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlsplit

__all__ = ["Placeholder", "MARKER", "placeholders_in", "env_placeholders", "main"]

#: ``# PLACEHOLDER: hint`` or ``# PLACEHOLDER(env): hint`` at the end of a YAML line
MARKER = re.compile(r"#\s*PLACEHOLDER(?:\((?P<env>[A-Za-z0-9_.-]+)\))?\s*:?\s*(?P<hint>.*)$")
# RFC 2606 / 6761 names that can never be a real host
_RESERVED_HOST = re.compile(r"(?i)(^|\.)(example\.(com|org|net)|[a-z0-9-]+\.(example|invalid|test|localhost))$"
                            r"|^(example|invalid|test)$")
_KEY = re.compile(r"^(?P<indent>\s*)(?:-\s+)?(?P<key>[A-Za-z0-9_.\-${}\"']+)\s*:(?:\s+(?P<value>.*))?$")


@dataclass(frozen=True)
class Placeholder:
    """One value still to replace: where it is and what to put there."""

    path: str
    line: int
    field: str
    value: str
    hint: str

    def __str__(self) -> str:
        shown = f" = {self.value}" if self.value else ""
        return f"{self.path}:{self.line}: {self.field}{shown} is a placeholder: {self.hint}"


def _strip_comment(text: str) -> str:
    """A YAML line without its trailing comment (a '#' outside quotes, after a space)."""
    quote = None
    for i, ch in enumerate(text):
        if ch in "\"'" and quote is None:
            quote = ch
        elif ch == quote:
            quote = None
        elif ch == "#" and quote is None and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


def placeholders_in(path: str | Path, env_name: Optional[str] = None, *, own_file: bool = True,
                    label: Optional[str] = None) -> list[Placeholder]:
    """The marked lines of the YAML file ``path``: every value followed on its line by a
    ``# PLACEHOLDER`` comment (a comment line alone is prose, never a marker): all of them in
    the env's own file (``own_file=True``), only those scoped to ``env_name`` in a shared one
    (``# PLACEHOLDER(env_name)``). The field is the dotted path of mapping keys down to the
    line (from its indentation); a marked key without a value (a principal's name in the
    access policy) is the value itself. ``label`` is the path shown (default: ``path``)."""
    p = Path(path)
    out: list[Placeholder] = []
    stack: list[tuple[int, str]] = []
    for no, raw in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        body = _strip_comment(raw)
        m = _KEY.match(body) if body.strip() else None
        key = None
        if m:
            indent = len(m.group("indent"))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            key = m.group("key").strip("\"'")
            stack.append((indent, key))
        # a marker follows a value on its line: a comment line that mentions one is prose
        marker = MARKER.search(raw[len(body):]) if body.strip() and len(raw) > len(body) else None
        if marker is None:
            continue
        scope = marker.group("env")
        if scope is not None and scope != env_name:
            continue
        if scope is None and not own_file:
            continue
        value = (m.group("value") or "").strip().strip("\"'") if m else body.strip().lstrip("- ").strip("\"'")
        field = ".".join(k for _, k in stack) or "(top level)"
        out.append(Placeholder(label or str(p), no, field, value,
                               marker.group("hint").strip() or "replace it with your deployment's value"))
    return out


def _project_root(env_file: Path) -> Path:
    # conf/envs/x.yaml -> the project root (as dp_spark.config.load_env resolves it)
    return env_file.parent.parent.parent if env_file.parent.parent.name == "conf" else env_file.parent


def _shown(p: Path, root: Path) -> str:
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)


def env_placeholders(env: Any, env_file: str | Path | None = None) -> list[Placeholder]:
    """Every placeholder still present for ``env`` (an :class:`~dp_spark.config.EnvConfig`):
    its env file (``env_file``, default ``env.source``), the budget policies and the access
    policy beside them, and the project's ``databricks.yml`` when it names the env file; then
    a reserved example host in ``env.ledger_url`` that no marker already reported. Paths are
    shown relative to the project root."""
    env_path = Path(env_file if env_file is not None else env.source).resolve()
    root = _project_root(env_path)
    found: list[Placeholder] = []
    if env_path.is_file():
        found += placeholders_in(env_path, env.name, own_file=True, label=_shown(env_path, root))
    policies = Path(env.policies)
    for shared in (policies, policies.parent / "access.yaml"):
        if shared.is_file():
            found += placeholders_in(shared, env.name, own_file=False, label=_shown(shared, root))
    bundle = root / "databricks.yml"
    if bundle.is_file() and env_path.is_file():
        rel = _shown(env_path, root)
        if rel in bundle.read_text(encoding="utf-8"):
            found += placeholders_in(bundle, env.name, own_file=False, label=_shown(bundle, root))
    host = urlsplit(str(env.ledger_url)).hostname if "://" in str(env.ledger_url) else None
    if host and _RESERVED_HOST.search(host) and not any(f.field == "ledger_url" for f in found):
        found.append(Placeholder(_shown(env_path, root), 0, "ledger_url", host,
                                 "a reserved example host (RFC 2606): your ledger database's host"))
    return found


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m dp_spark.deploy_check --env FILE``: print the placeholders; exit 1 if any."""
    from dp_spark.config import load_env
    from dp_spark.errors import DpSparkError

    ap = argparse.ArgumentParser(prog="python -m dp_spark.deploy_check", description=__doc__.splitlines()[0])
    ap.add_argument("--env", required=True, metavar="ENV", help="the env file of the deployment")
    args = ap.parse_args(argv)
    try:
        env = load_env(args.env)
    except DpSparkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    found = env_placeholders(env, args.env)
    for p in found:
        print(p)
    if found:
        print(f"{len(found)} placeholder(s) left for env '{env.name}': docs/deploy.md, \"Before the first deploy\"")
        return 1
    print(f"env '{env.name}': no placeholder left")
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through main()
    sys.exit(main())
