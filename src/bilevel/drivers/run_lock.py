"""A directory owned by one run: a lock file holding the owner's pid, host and start.

``bilevel run --out DIR`` locks ``DIR``, and ``bl.solve(checkpoint=DIR)`` locks its checkpoint
directory, so two runs never write the same checkpoint or outputs. The lock file is created
atomically (``O_CREAT | O_EXCL``) and removed when the run ends, normally, by an exception or
after Ctrl-C / SIGTERM (:class:`bilevel.Interrupted`). A run killed outright (SIGKILL, a power
cut) leaves it behind: the next run takes it over when it can tell that its owner is gone (the
same host, and the pid is not running, belongs to a process started after the lock, or the
machine has rebooted since); a lock of another host (a shared filesystem) is never taken over.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from bilevel.drivers.writes import WriteError

__all__ = ["LOCK_FILE", "DirectoryInUse", "Owner", "RunLock"]

LOCK_FILE = "bilevel.lock"


class DirectoryInUse(ValueError):
    """Another live run owns the directory (a ``ValueError``: the command line prints it as
    one line)."""


class Owner(NamedTuple):
    """Who holds a lock: what the lock file says."""

    pid: int
    host: str
    started: float  # time.time() when it took the lock
    boot: str  # the host's boot id ("" where unknown): a reboot frees every lock
    token: str  # tells two locks of one process apart

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host} (started {when})"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), where ``/proc`` tells (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


#: how much earlier than its lock a process may seem to start (clock steps, /proc rounding)
START_SLACK = 10.0


def gone(owner: Owner) -> str:
    """Why ``owner`` cannot be running any more, or ``""`` when it may be (another host's
    processes cannot be seen from here)."""
    if owner.host != socket.gethostname():
        return ""
    if owner.boot and owner.boot != _boot_id():
        return f"{owner.host} has rebooted since"
    if not _running(owner.pid):
        return f"pid {owner.pid} is not running"
    start = _process_start(owner.pid)
    if start is not None and start > owner.started + START_SLACK:
        return f"pid {owner.pid} now belongs to a process started after the lock"
    return ""


class RunLock:
    """The lock of ``directory``; :meth:`acquire` (or ``with``) takes it, :meth:`release` (or
    leaving the block) removes it.

    Args:
        directory: the directory to own (it must exist).
        instead: what to use instead, in the refusal (``"--out"``, ``"checkpoint directory"``).
        log: called with one line when a stale lock is taken over (``None``: silent).
    """

    def __init__(self, directory: Path, instead: str, log: Callable[[str], None] | None = None):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.instead = instead
        self.log = log
        self.owner: Owner | None = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def acquire(self) -> RunLock:
        """Take the lock, taking over a stale one; :class:`DirectoryInUse` if a live run has it,
        :class:`~bilevel.drivers.writes.WriteError` (an ``OSError``) if the directory cannot be
        written."""
        me = Owner(os.getpid(), socket.gethostname(), time.time(), _boot_id(), secrets.token_hex(8))
        for _ in range(5):  # a lock that vanishes or changes hands while looked at: look again
            if self._create(me):
                self.owner = me
                return self
            holder = self._read()
            if holder is None:
                continue
            why = "the lock file is unreadable" if isinstance(holder, str) else gone(holder)
            if not why:
                raise DirectoryInUse(self._refusal(holder))
            if self._take_away(holder) and self.log is not None:
                who = holder if isinstance(holder, str) else holder.describe()
                self.log(f"{self.directory}: took over the lock of {who} ({why})")
        raise DirectoryInUse(f"{self.directory} is contended: its lock changes hands; retry.")

    def release(self) -> None:
        """Remove the lock file if it is still this run's."""
        if self.owner is None:
            return
        if self._read() == self.owner:
            try:
                self.path.unlink()
            except OSError:  # gone, or the directory turned read-only: the next run takes over
                pass
        self.owner = None

    def _refusal(self, holder: Owner) -> str:
        text = (
            f"{self.directory} is in use by {holder.describe()}; wait for it or use another "
            f"{self.instead}"
        )
        if holder.host != socket.gethostname():  # cannot be checked from here
            text += f" (if that run is gone, delete {self.path})"
        return text + "."

    def _create(self, me: Owner) -> bool:
        """Write the lock file; ``False`` if there is one already. A directory that cannot be
        written (read-only, a full disk) raises :class:`~bilevel.drivers.writes.WriteError`
        naming the lock file, and leaves none behind."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError as err:
            raise WriteError(self.path, err) from err
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(me._asdict()))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:
            with contextlib.suppress(OSError):
                self.path.unlink()
            raise WriteError(self.path, err) from err
        return True

    def _read(self, path: Path | None = None, tries: int = 10) -> Owner | str | None:
        """The lock's owner; ``None`` if there is no lock file; a description (``str``) of a
        file that stays unreadable for a while (its writer died between creating and
        writing it)."""
        for _ in range(tries):
            try:
                return Owner(**json.loads((path or self.path).read_text()))
            except FileNotFoundError:
                return None
            except (OSError, ValueError, TypeError):
                time.sleep(0.05)  # being written now: its writer holds it in a moment
        return f"an unreadable lock file ({path or self.path})"

    def _take_away(self, holder: Owner | str) -> bool:
        """Remove the stale lock of ``holder``; ``False`` when another run took it over first
        (its new lock, renamed aside here, is put back)."""
        aside = self.path.with_name(f"{LOCK_FILE}.stale-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)  # one process wins the rename of a given file
        except FileNotFoundError:
            return False
        seen = self._read(aside, tries=1)
        same = seen == holder if isinstance(holder, Owner) else isinstance(seen, str)
        if not same:
            os.rename(aside, self.path)  # not the lock judged stale: someone else's new one
            return False
        aside.unlink()
        return True
