"""An acknowledged PostgreSQL charge survives a server crash (issue 13, "Trust", item 1).

The test starts its own PostgreSQL server in a temporary directory, configured with
``synchronous_commit = off`` (so a plain COMMIT returns before its WAL is on disk) and a long
``wal_writer_delay`` (so that WAL stays in memory for seconds). It makes N reservations and
commits through PostgresLedger, stops the server with ``pg_ctl stop -m immediate`` (no
shutdown checkpoint, the WAL buffers in shared memory are dropped), restarts it and checks
that every acknowledged entry, in its acknowledged state, is still there and verify() passes.
The ledger requires a synchronous commit in each of its own write transactions, so the
server's default does not matter. A server with ``fsync = off`` is refused.

The server binaries are found as .ci/postgres.sh finds them (initdb on PATH, else Debian's
/usr/lib/postgresql/*/bin, newest first). Without them the test is skipped locally and FAILS
under CI=true (where .ci/test.sh installs Debian's postgresql).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest

from dp_spark.core.budget import PureDP
from dp_spark.errors import LedgerError
from dp_spark.ledger import open_ledger
from tests.ledger.conftest import TEST_KEY, make_policy

N = 41  # reservations; every other one is committed too (the last is only reserved)


def _version_key(path: str) -> tuple:
    m = re.search(r"/postgresql/([0-9.]+)/bin$", path)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def _pg_bindir() -> Optional[Path]:
    """Like _pg_bindir in .ci/postgres.sh: initdb and pg_ctl on PATH, else the newest Debian dir."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        d = Path(os.path.realpath(initdb)).parent
        if (d / "pg_ctl").exists() and (d / "postgres").exists():
            return d
    import glob

    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A throwaway PostgreSQL cluster (owned by the `postgres` OS user when run as root)."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="dp_spark_pgdur."))
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.log = self.root / "server.log"
        self.data.mkdir()
        self.sock.mkdir()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
            for p in (self.data, self.sock):
                shutil.chown(p, "postgres", "postgres")
        os.chmod(self.root, 0o700)
        self.port = 0

    def _cmd(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        argv = list(args)
        if self.as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed ({res.returncode}): {res.stdout}{res.stderr}\n{log}")
        return res

    def init(self, **settings: str) -> None:
        self._cmd(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8", "--no-locale")
        conf = "".join(f"{k} = {v}\n" for k, v in settings.items())
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as f:
            f.write("\n# dp_spark durability test\n" + conf)

    def start(self, *options: str) -> None:
        last = ""
        for _ in range(5):
            port = self.port or _free_port()
            opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {self.sock} " + " ".join(options)
            res = self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
                            "-t", "60", "-o", opts, "start", check=False)
            if res.returncode == 0:
                self.port = port
                return
            last = res.stdout + res.stderr
            self.port = 0 if not self.port else self.port
            time.sleep(0.5)
        log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        raise RuntimeError(f"could not start PostgreSQL: {last}\n{log}")

    def stop(self, mode: str = "fast") -> None:
        self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def setting(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            return conn.execute(f"SHOW {name}").fetchone()[0]

    def destroy(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._cmd(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                      check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def server():
    bindir = _pg_bindir()
    if bindir is None:
        msg = "PostgreSQL server binaries (initdb, pg_ctl) not found (apt-get install postgresql)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the PostgreSQL durability test must run in CI: {msg}")
        pytest.skip(msg)
    srv = Server(bindir)
    try:
        # What a fast but unsafe server looks like: a COMMIT returns before its WAL is flushed,
        # and the WAL writer waits 10 s between rounds. fsync stays on (the ledger refuses off).
        srv.init(fsync="on", synchronous_commit="off", wal_writer_delay="'10s'",
                 max_connections="20", shared_buffers="'16MB'")
        srv.start()
        yield srv
    finally:
        srv.destroy()


def test_acknowledged_charges_survive_an_immediate_stop(server):
    assert server.setting("synchronous_commit") == "off"  # the server default the ledger must override
    acknowledged: dict[str, str] = {}
    ledger = open_ledger(server.url, key=TEST_KEY)
    try:
        ledger.register_budget(make_policy("b", cap=1000))
        for i in range(N):
            rid = f"release-{i:03d}"
            r = ledger.reserve("b", rid, PureDP(1), "{}", principal="alice",
                               code_version="v1", release_family="fam", owner_token=f"owner-{i}",
                               lease_seconds=300)
            assert not r.reused and r.entry.seq == i + 1
            acknowledged[rid] = "reserved"
            if i % 2:
                ledger.commit(rid, f"owner-{i}")
                acknowledged[rid] = "committed"
    finally:
        ledger.close()
    # Crash the server at once: no shutdown checkpoint, WAL buffers in memory are lost.
    server.stop("immediate")
    server.start()

    ledger = open_ledger(server.url, key=TEST_KEY)
    try:
        found = {rid: ledger.find(rid) for rid in acknowledged}
        lost = sorted(rid for rid, e in found.items() if e is None)
        changed = sorted(rid for rid, e in found.items() if e is not None and e.state != acknowledged[rid])
        assert not lost and not changed, (
            f"acknowledged but gone after the crash: {len(lost)} reservations {lost}, "
            f"{len(changed)} commits {changed}"
        )
        entries = ledger.entries("b")
        assert [e.seq for e in entries] == list(range(1, N + 1))
        ledger.verify()
        assert ledger.status("b").spent == PureDP(N)
    finally:
        ledger.close()


def test_a_server_with_fsync_off_is_refused(server):
    server.stop("fast")
    server.start("-c fsync=off")
    assert server.setting("fsync") == "off"
    with pytest.raises(LedgerError, match=r"fsync") as err:
        open_ledger(server.url, key=TEST_KEY)
    assert "fsync = on" in str(err.value)


@pytest.mark.parametrize("ledger_factory", ["postgres"], indirect=True)
@pytest.mark.parametrize("session_default", ["off", "local", "remote_apply"])
def test_every_write_transaction_commits_synchronously(ledger_factory, session_default):
    """Whatever the session default (here set in the URL), a write transaction runs with at
    least synchronous_commit = on; a stronger remote_apply is kept; reads are left alone."""
    url = f"{ledger_factory.url}%20-csynchronous_commit%3D{session_default}"
    ledger = open_ledger(url, key=TEST_KEY)
    try:
        with ledger._transaction(True) as cur:
            in_write = cur.one("SHOW synchronous_commit")[0]
        with ledger._transaction(False) as cur:
            in_read = cur.one("SHOW synchronous_commit")[0]
    finally:
        ledger.close()
    assert in_write == ("remote_apply" if session_default == "remote_apply" else "on")
    assert in_read == session_default
