"""Who may do what: principals, roles, permissions and pre-registered release specs.

The policy file (``conf/policies/access.yaml``, see ``docs/governance.md``)::

    version: 1
    releases_dir: conf/releases        # the pre-registered specs (relative to the project root)
    pinned_versions: {}                # optional: spec name -> the only version allowed
    principals:
      analyst_alice: {roles: [analyst], exploration_budgets: [demo_events_user]}
      publisher_bob: {roles: [publisher]}
      admin_carol:   {roles: [admin]}
    local_default:                     # optional: see "The local default" below
      envs: [local]
      roles: [publisher, analyst]
      exploration_budgets: [demo_events_user]

Roles and what they permit (fixed in code, so a policy file cannot invent a permission):

* ``analyst``   -- ``publish`` in mode ``exploration``, only on the budgets listed as that
  principal's ``exploration_budgets``. Exploration output goes to the env's exploration
  root, is marked ``mode = exploration`` and is never put in a published view;
* ``publisher`` -- ``publish`` in mode ``official``, only from a *pre-registered* spec: a
  spec file under ``releases_dir`` whose content hash (``ReleaseSpec.version()``) equals the
  spec being published (or a per-day restriction of it, ``ReleaseSpec.for_keys``), and, if
  ``pinned_versions`` names it, equals the pinned version;
* ``admin``     -- ``rollback`` of a published version and ``admin`` (budgets, policies).

Default deny: a principal that is not listed gets no permission. Roles do not inherit: an
admin cannot publish and a publisher cannot roll back unless the principal holds both roles
(separation of duties is the default; combining roles is an explicit choice in the file).

The local default. On a laptop the person who runs ``make demo`` is nobody in the policy
file. ``local_default`` grants its roles to an *unlisted* principal only when the env's name
is in ``local_default.envs`` **and** ``$DP_SPARK_PRINCIPAL`` is unset, i.e. the identity
came from the OS or Spark user of a local session. A job that declares its identity with
``$DP_SPARK_PRINCIPAL`` is matched strictly against ``principals``; a cluster env (any name
not listed) never gets the default. Use :meth:`AccessPolicy.for_env` to obtain the
policy in force for an env.

Every check runs before any data is read; a refusal raises
:class:`~dp_spark.errors.PermissionDeniedError` naming the principal, its roles and the
missing permission (never a data value). :func:`authorize` also writes the refusal to the
audit log. Nothing here imports pyspark (the Spark session is only queried, lazily, by
:func:`resolve_principal`).
"""

from __future__ import annotations

import getpass
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from dp_spark.errors import ConfigError, DpSparkError, PermissionDeniedError
from dp_spark.spec.access import ROLES, access_policy_model

__all__ = [
    "ROLES",
    "ACTIONS",
    "PRINCIPAL_ENV",
    "PrincipalGrant",
    "AccessPolicy",
    "load_access_policy",
    "access_policy_for_env",
    "resolve_principal",
    "resolve_principal_with_source",
    "is_preregistered",
    "authorize",
]

_log = logging.getLogger("dp_spark.governance.access")
PRINCIPAL_ENV = "DP_SPARK_PRINCIPAL"
ACTIONS = ("publish", "rollback", "admin")
MODES = ("official", "exploration")
MAX_PRINCIPAL_LEN = 256


# --------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrincipalGrant:
    """The roles of one principal and the budgets it may spend in exploration mode."""

    roles: frozenset[str]
    exploration_budgets: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = sorted(set(self.roles) - set(ROLES))
        if unknown:
            raise ConfigError(f"unknown role {unknown[0]!r} (roles: {list(ROLES)})")
        if self.exploration_budgets and "analyst" not in self.roles:
            raise ConfigError("exploration_budgets are only meaningful for the analyst role")


@dataclass(frozen=True)
class AccessPolicy:
    """Principals -> roles; the pre-registered specs; the optional local default.

    ``local_default`` is the grant an unlisted principal gets when the policy is in force
    for a local env (see :meth:`for_env`); ``local_envs`` are the env names it applies to.
    ``active_default`` is set only on the policy returned by :meth:`for_env`.
    """

    principals: Mapping[str, PrincipalGrant]
    releases_dir: Path
    pinned_versions: Mapping[str, str] = field(default_factory=dict)
    local_default: Optional[PrincipalGrant] = None
    local_envs: tuple[str, ...] = ()
    active_default: Optional[PrincipalGrant] = None
    source: str = field(default="<dict>", compare=False)

    # -- the policy in force for an env ---------------------------------------------------
    def for_env(self, env_name: str, environ: Mapping[str, str] = os.environ) -> "AccessPolicy":
        """The policy in force for env ``env_name``: the local default is active only for a
        local env and only when ``$DP_SPARK_PRINCIPAL`` is unset."""
        active = None
        if self.local_default is not None and env_name in self.local_envs and not environ.get(PRINCIPAL_ENV):
            active = self.local_default
        return replace(self, active_default=active)

    # -- lookups ---------------------------------------------------------------------
    def grant_of(self, principal: str) -> Optional[PrincipalGrant]:
        if principal in self.principals:
            return self.principals[principal]
        return self.active_default

    def roles_of(self, principal: str) -> frozenset[str]:
        g = self.grant_of(principal)
        return frozenset() if g is None else g.roles

    # -- the check ---------------------------------------------------------------------
    def check(
        self,
        principal: str,
        action: str,
        *,
        mode: Optional[str] = None,
        spec_path: Optional[str | os.PathLike] = None,
        budget_id: Optional[str] = None,
        spec: Any = None,
    ) -> None:
        """Return None when ``principal`` may do ``action``; raise PermissionDeniedError.

        * ``publish`` with ``mode="official"``: role ``publisher`` and a pre-registered spec
          (``spec_path`` under ``releases_dir``; when ``spec`` (a ReleaseSpec) is given, its
          content hash must match the registered file's, see :func:`is_preregistered`);
        * ``publish`` with ``mode="exploration"``: role ``analyst`` and ``budget_id`` in the
          principal's exploration budgets;
        * ``rollback`` and ``admin``: role ``admin``.

        Unknown principals, actions and modes are refused (default deny).
        """
        name = _principal_label(principal)
        grant = self.grant_of(principal) if isinstance(principal, str) else None
        roles = sorted(grant.roles) if grant is not None else []
        who = f"principal {name!r} (roles: {', '.join(roles) if roles else 'none'})"

        def deny(why: str) -> PermissionDeniedError:
            return PermissionDeniedError(f"{who} may not {label}: {why}")

        if action not in ACTIONS:
            label = str(action)[:64]
            raise deny(f"unknown action (known: {list(ACTIONS)}); default deny")
        if action == "publish":
            if mode not in MODES:
                label = "publish"
                raise deny(f"mode must be one of {list(MODES)}")
            label = f"publish:{mode}"
        else:
            label = action
        if grant is None:
            raise deny("the principal is not listed in the access policy (default deny); "
                       f"ask an admin to add it to {self.source}")

        if action in ("rollback", "admin"):
            if "admin" not in grant.roles:
                raise deny("missing permission 'admin' (role admin is required)")
            return
        if mode == "official":
            if "publisher" not in grant.roles:
                raise deny("missing permission 'publish:official' (role publisher is required; "
                           "analysts may run exploration releases only)")
            if spec_path is None:
                raise deny("official releases need a pre-registered spec file "
                           f"under {self.releases_dir}")
            ok, why = _preregistration(spec_path, self.releases_dir, spec, self.pinned_versions)
            if not ok:
                raise deny(f"the spec is not pre-registered: {why}")
            return
        # exploration
        if "analyst" not in grant.roles:
            raise deny("missing permission 'publish:exploration' (role analyst is required)")
        if budget_id is None:
            raise deny("an exploration release must name the budget it spends")
        if budget_id not in grant.exploration_budgets:
            raise deny(f"missing permission 'explore:{budget_id}' (budget {budget_id!r} is not one of "
                       "this principal's exploration budgets)")


def _principal_label(principal: Any) -> str:
    if not isinstance(principal, str) or not principal:
        return "<none>"
    return principal[:MAX_PRINCIPAL_LEN]


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------
def _project_root(p: Path) -> Path:
    # conf/policies/x.yaml -> the project root; otherwise the file's folder
    if p.parent.name == "policies" and p.parent.parent.name == "conf":
        return p.parent.parent.parent
    return p.parent


def access_policy_from_dict(data: Any, source: str = "<dict>", root: Optional[Path] = None) -> AccessPolicy:
    """Validate a parsed access policy (:class:`dp_spark.spec.access.AccessPolicyModel`: every
    problem at once); relative ``releases_dir`` resolves against ``root``."""
    m = access_policy_model(data, source)
    root = root or Path.cwd()
    releases_dir = Path(m.releases_dir) if Path(m.releases_dir).is_absolute() else root / m.releases_dir

    def grant(g: Any) -> PrincipalGrant:
        return PrincipalGrant(roles=frozenset(g.roles), exploration_budgets=frozenset(g.exploration_budgets or ()))

    principals = {name: grant(g) for name, g in (m.principals or {}).items()}
    ld = m.local_default
    return AccessPolicy(principals=principals, releases_dir=releases_dir.resolve(),
                        pinned_versions=dict(m.pinned_versions or {}),
                        local_default=None if ld is None else grant(ld),
                        local_envs=() if ld is None else tuple(ld.envs), source=source)


def load_access_policy(path: str | os.PathLike) -> AccessPolicy:
    """Load and validate an access policy file (YAML); errors name the file and field."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: access policy file not found (default deny: nothing may run without one)")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        raise ConfigError(f"{p}: invalid YAML") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    return access_policy_from_dict(data, str(p), root=_project_root(p.resolve()))


def access_policy_for_env(env: Any, environ: Mapping[str, str] = os.environ) -> AccessPolicy:
    """The access policy in force for an :class:`~dp_spark.config.EnvConfig`: the file
    ``access.yaml`` beside the env's budget policy file, with the local default resolved
    for the env's name (:meth:`AccessPolicy.for_env`)."""
    path = Path(env.policies).parent / "access.yaml"
    return load_access_policy(path).for_env(env.name, environ)


# --------------------------------------------------------------------------------------
# Principals
# --------------------------------------------------------------------------------------
def _valid_principal(p: Any) -> Optional[str]:
    if isinstance(p, str):
        p = p.strip()
        if p and len(p) <= MAX_PRINCIPAL_LEN and p.isprintable():
            return p
    return None


def _sql_current_user(spark) -> Optional[str]:
    try:
        row = spark.sql("SELECT current_user() AS u").first()
        return None if row is None else _valid_principal(row["u"])
    except Exception:
        return None


LOCAL_ENV_NAME = "local"


def resolve_principal_with_source(spark=None, env: Mapping[str, str] = os.environ, *,
                                  env_name: Optional[str] = None) -> tuple[str, str]:
    """(principal, source) where source is ``env``, ``notebook``, ``spark`` or ``os``.

    ``$DP_SPARK_PRINCIPAL`` is honoured only on the ``local`` env (``env_name == "local"``,
    a laptop, where jobs may declare their identity) and in tests (``DP_SPARK_TEST_MODE=1``
    in ``env``); on every other env (and when ``env_name`` is not given) it is ignored: an
    environment variable is set by whoever configures the job, so it cannot be an identity.
    Then: in a Databricks notebook
    (``$DATABRICKS_RUNTIME_VERSION`` set) the notebook user (``spark.conf``
    ``spark.databricks.notebook.userName`` if present, else SQL ``current_user()``, which
    Databricks resolves to the notebook's user); else the Spark user
    (``sparkContext.sparkUser()``; on Spark Connect, which has no sparkContext, SQL
    ``current_user()``); else ``getpass.getuser()``. Every Spark call is guarded.
    """
    declared = _valid_principal(env.get(PRINCIPAL_ENV))
    if declared:
        # tests (DP_SPARK_TEST_MODE=1, never set in production) may declare it on any env
        if env_name == LOCAL_ENV_NAME or env.get("DP_SPARK_TEST_MODE") == "1":
            return declared, "env"
        _log.warning("$%s is ignored outside the %r env: the principal comes from the platform",
                     PRINCIPAL_ENV, LOCAL_ENV_NAME)
    if spark is not None:
        if env.get("DATABRICKS_RUNTIME_VERSION"):
            try:
                p = _valid_principal(spark.conf.get("spark.databricks.notebook.userName", None))
            except Exception:
                p = None
            p = p or _sql_current_user(spark)
            if p:
                return p, "notebook"
        try:
            p = _valid_principal(spark.sparkContext.sparkUser())
        except Exception:  # Spark Connect: no sparkContext
            p = _sql_current_user(spark)
        if p:
            return p, "spark"
    try:
        p = _valid_principal(getpass.getuser())
    except Exception:
        p = None
    if not p:
        how = f"set ${PRINCIPAL_ENV}" if env_name == LOCAL_ENV_NAME else "run it where Spark or the OS knows the user"
        raise PermissionDeniedError(f"no principal could be determined: {how}")
    return p, "os"


def resolve_principal(spark=None, env: Mapping[str, str] = os.environ, *, env_name: Optional[str] = None) -> str:
    """The principal running this job (see :func:`resolve_principal_with_source`)."""
    return resolve_principal_with_source(spark, env, env_name=env_name)[0]


# --------------------------------------------------------------------------------------
# Pre-registration
# --------------------------------------------------------------------------------------
def _inside(path: Path, directory: Path) -> bool:
    try:
        path.relative_to(directory)
        return True
    except ValueError:
        return False


def _matches(spec: Any, registered: Any) -> bool:
    """``spec`` is the registered spec, or its restriction to some of its public keys
    (``ReleaseSpec.for_keys``, used by scheduled per-day runs)."""
    if spec.version() == registered.version():
        return True
    if not spec.name.startswith(registered.name) or spec.name == registered.name:
        return False
    if getattr(spec, "metric", None) is None:
        # a multi-statistic spec restricted on its date-keyed column (a daily refresh)
        dated, reg_dated = spec.date_key_set, registered.date_key_set
        if dated is None or reg_dated is None or dated.column != reg_dated.column:
            return False
        keys, column = tuple(dated.values), dated.column
    else:
        if registered.group_by is None or spec.group_by is None:
            return False
        keys, column = tuple(spec.group_by.values), None
    try:
        derived = registered.for_keys(keys, name_suffix=spec.name[len(registered.name):], column=column)
    except DpSparkError:
        return False
    return derived.version() == spec.version()


def _preregistration(spec_path, releases_dir, spec=None, pins: Optional[Mapping[str, str]] = None) -> tuple[bool, str]:
    from dp_spark.config import load_release_spec

    try:
        path = Path(spec_path).resolve(strict=True)  # symlinks resolved: no escape from the dir
    except (OSError, RuntimeError, TypeError):
        return False, "the spec file does not exist"
    rdir = Path(releases_dir).resolve()
    if not _inside(path, rdir):
        return False, f"the spec file is not under the registered releases directory {rdir}"
    if not path.is_file() or path.suffix not in (".yaml", ".yml"):
        return False, "the spec is not a YAML file"
    try:
        registered = load_release_spec(path)
    except DpSparkError:
        return False, "the registered spec file does not validate"
    if spec is not None and not _matches(spec, registered):
        return False, (f"its content hash differs from the registered file's version {registered.version()} "
                       "(an edited spec is a new version: register it under the releases directory)")
    pins = pins or {}
    if registered.name in pins and pins[registered.name] != registered.version():
        return False, (f"spec {registered.name!r} is pinned to version {pins[registered.name]}; "
                       f"the file has version {registered.version()} (an admin must update the pin)")
    return True, "ok"


def is_preregistered(spec_path: str | os.PathLike, releases_dir: str | os.PathLike, spec: Any = None,
                     pinned_versions: Optional[Mapping[str, str]] = None) -> bool:
    """True when ``spec_path`` is a valid spec file inside ``releases_dir`` (symlinks
    resolved) and, when ``spec`` is given, ``spec`` has the file's content hash (or is its
    ``for_keys`` restriction); when ``pinned_versions`` names the spec, the file's version
    must equal the pin."""
    return _preregistration(spec_path, releases_dir, spec, pinned_versions)[0]


# --------------------------------------------------------------------------------------
# Check + audit the refusal
# --------------------------------------------------------------------------------------
def authorize(
    policy: AccessPolicy,
    principal: str,
    action: str,
    *,
    mode: Optional[str] = None,
    spec: Any = None,
    spec_path: Optional[str | os.PathLike] = None,
    budget_id: Optional[str] = None,
    ledger: Any = None,
    spec_name: Optional[str] = None,
    spec_version: Optional[str] = None,
) -> None:
    """:meth:`AccessPolicy.check`, and on refusal one audit row (decision
    ``refused_permission``, the message as detail) before re-raising.

    With ``spec`` given, ``spec_path`` defaults to ``spec.source``, ``budget_id`` to
    ``spec.budget_id``. The allowed case writes nothing: the caller's outcome row
    (published, cache_hit, ...) is the request's one audit row.
    """
    if spec is not None:
        spec_path = spec_path if spec_path is not None else spec.source
        budget_id = budget_id if budget_id is not None else spec.budget_id
        spec_name = spec_name or spec.name
        spec_version = spec_version or spec.version()
    try:
        policy.check(principal, action, mode=mode, spec_path=spec_path, budget_id=budget_id, spec=spec)
    except PermissionDeniedError as exc:
        if ledger is not None:
            ledger.append_audit(
                principal=_principal_label(principal), action=f"{action}:{mode}" if action == "publish" else action,
                spec_name=spec_name, spec_version=spec_version, decision="refused_permission",
                release_id=None, charge_json=None, detail=str(exc)[:500],
            )
        raise
