"""The bounding salt: one per warehouse, confidential, created atomically on first use.

The salt keys the bottom-K priority of contribution bounding (``salt_file`` in the env). The
DP guarantee does not depend on it being secret; its confidentiality only keeps the kept
sample uniform against someone who chooses data (see
:func:`dp_spark.backends.bounding.bound_contributions`, which keeps it out of Spark plans), so
every run of a dataset must read the same one, and several drivers may start at once on a
fresh warehouse. Creation is therefore all-or-nothing, like the ledger's key file: a fresh
salt is written to a temporary file in the same directory (mode 0600), fsynced, and
hard-linked to the final name. ``os.link`` fails if the name exists, so exactly one process
wins; every other one reads the winner's salt back. The final name never shows an empty or
partial salt. (Only on a filesystem without hard links is the salt created in place with
``O_EXCL``; readers then wait for it to be complete.)

An empty or malformed salt file (a crash of an older writer, a hand edit) is waited on for a
few seconds, in case another writer is still filling it, then refused with a ``ConfigError``
naming the file and what is wrong. No error ever shows the salt.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import time
from pathlib import Path
from typing import Optional, Union

from dp_spark.errors import ConfigError

__all__ = ["read_or_create_salt", "read_salt", "SALT_WAIT_SECONDS", "MIN_SALT_CHARS"]

SALT_BYTES = 32  # a fresh salt: 64 hex characters
MIN_SALT_CHARS = 32  # a salt file must hold at least this many characters (128 bits of hex)
SALT_WAIT_SECONDS = 5.0  # how long an empty or malformed salt is waited on before refusing
_SALT_RE = re.compile(r"[0-9A-Za-z+/=_.:-]+")  # hex, base64, base64url: one token, no spaces
# os.link errors meaning "this filesystem has no hard links" (FUSE mounts, some SMB shares)
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}


def read_or_create_salt(path: Union[str, Path], *, wait_seconds: float = SALT_WAIT_SECONDS) -> str:
    """The salt stored at ``path``; created (0600, atomically) if there is none yet.

    Safe to call from any number of processes at once: all of them get the same salt.
    """
    path = Path(path)
    deadline = time.monotonic() + wait_seconds
    delay = 0.005
    while True:
        text = _read(path)
        if text is None:  # no salt yet: try to create it
            created = _create(path)
            if created is not None:
                return created
            continue  # another process created it first: read theirs
        problem = _problem(text)
        if problem is None:
            return text.strip()
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"bounding salt file {path} {problem}. It was not written completely (a crash, "
                f"or a writer that is still running) or was edited. Restore it from a backup; "
                f"remove it only if nothing was published with it (a new salt makes every "
                f"rerun a different release)"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def read_salt(path: Union[str, Path], *, wait_seconds: float = SALT_WAIT_SECONDS) -> Optional[str]:
    """The salt stored at ``path``, or None when there is none yet: nothing is created.

    The engine validates a release with this (and a provisional salt when there is none), so a
    refused release leaves no salt file behind; :func:`read_or_create_salt` runs only once
    the release is known to be valid. A malformed salt file is refused as there.
    """
    if _read(Path(path)) is None:
        return None
    return read_or_create_salt(path, wait_seconds=wait_seconds)


def _read(path: Path) -> Optional[str]:
    """The file's text, None when it does not exist."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"bounding salt file {path} cannot be read: {exc.strerror or type(exc).__name__}") from None
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        return "\x00"  # not ASCII: malformed (and never echoed)


def _problem(text: str) -> Optional[str]:
    """What is wrong with a salt file's text (never quoting it), None when it is a salt."""
    salt = text.strip()
    if not salt:
        return "is empty"
    if not _SALT_RE.fullmatch(salt):
        return "is malformed (not a single token of hex or base64 characters)"
    if len(salt) < MIN_SALT_CHARS:
        return f"is malformed (shorter than {MIN_SALT_CHARS} characters)"
    return None


def _create(path: Path) -> Optional[str]:
    """Create ``path`` with a fresh salt; the salt, or None if another process created it first."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"bounding salt directory {path.parent} cannot be created: {exc.strerror or type(exc).__name__}"
        ) from None
    salt = secrets.token_hex(SALT_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise ConfigError(f"bounding salt file {path} cannot be created: {exc.strerror or type(exc).__name__}") from None
    try:
        try:
            _write_all(fd, salt.encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and fails if the name exists: one process wins
        except FileExistsError:
            return None
        except OSError as exc:
            if exc.errno not in _NO_LINK:
                raise ConfigError(
                    f"bounding salt file {path} cannot be created: {exc.strerror or type(exc).__name__}"
                ) from None
            return _create_in_place(path, salt)
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    _fsync_dir(path.parent)
    return salt


def _create_in_place(path: Path, salt: str) -> Optional[str]:
    """Without hard links: O_EXCL create, write, fsync. Readers wait while it is still empty."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    except OSError as exc:
        raise ConfigError(f"bounding salt file {path} cannot be created: {exc.strerror or type(exc).__name__}") from None
    try:
        _write_all(fd, salt.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)
    return salt


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(directory: Path) -> None:
    """Make the new name durable (best effort: not every platform can fsync a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
