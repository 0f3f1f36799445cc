"""The ledger's HMAC key: from the caller, ``$DP_SPARK_LEDGER_KEY``, the file named by
``$DP_SPARK_LEDGER_KEY_FILE``, or a default key file beside an embedded ledger (created 0600).

A key is never logged nor put in a message. Nothing here imports pyspark.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import Optional

from dp_spark.errors import ConfigError

__all__ = ["KEY_ENV", "KEY_FILE_ENV", "MIN_KEY_BYTES", "resolve_key"]

KEY_ENV = "DP_SPARK_LEDGER_KEY"
KEY_FILE_ENV = "DP_SPARK_LEDGER_KEY_FILE"
MIN_KEY_BYTES = 16


def _key_from_text(text: str, where: str) -> bytes:
    key = text.strip().encode("utf-8")
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"ledger key from {where} is shorter than {MIN_KEY_BYTES} bytes")
    return key


def _read_key_file(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ConfigError(f"ledger key file {path} cannot be read") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"ledger key file {path} is accessible by group or others: chmod 600 it")
    try:
        return _key_from_text(path.read_text(encoding="utf-8"), f"file {path}")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"ledger key file {path} cannot be read") from None


def _create_key_file(path: Path) -> bytes:
    """Create ``path`` with a fresh random key (0600), atomically; another process may win."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails if another process created the key first
        except FileExistsError:
            pass
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_key_file(path)


def resolve_key(key: Optional[bytes], default_file: Optional[Path] = None, *, create: bool = True) -> bytes:
    """The HMAC key: ``key``, else ``$DP_SPARK_LEDGER_KEY`` (text), else the file named by
    ``$DP_SPARK_LEDGER_KEY_FILE``, else ``default_file`` (created 0600 when missing)."""
    if key is not None:
        if isinstance(key, str):
            key = key.encode("utf-8")
        if not isinstance(key, (bytes, bytearray)) or len(key) < MIN_KEY_BYTES:
            raise ConfigError(f"ledger key must be at least {MIN_KEY_BYTES} bytes")
        return bytes(key)
    env = os.environ.get(KEY_ENV)
    if env:
        return _key_from_text(env, f"${KEY_ENV}")
    env_file = os.environ.get(KEY_FILE_ENV)
    if env_file:
        return _read_key_file(Path(env_file))
    if default_file is None:
        raise ConfigError(f"this ledger needs an HMAC key: pass key=, or set ${KEY_ENV} or ${KEY_FILE_ENV}")
    if default_file.exists():
        return _read_key_file(default_file)
    if not create:
        raise ConfigError(f"ledger key file {default_file} is missing")
    return _create_key_file(default_file)
