"""Keep a cluster's ranks to themselves: a private rendezvous, loopback-only sockets,
no inherited sockets, and no process left behind.

Note [Rank isolation]
---------------------
Background: a single-machine cluster needs no network. Yet a ``TCPStore`` listens on
every interface (``:::PORT``, whatever host it is given) and lets anyone who connects
read and write its keys; gloo listens on the address the hostname resolves to (often
the LAN); and a forked rank inherits every descriptor of the kernel (Jupyter's zmq
sockets, the telemetry collector, any listening socket). A rank killed with SIGKILL
leaves its own children running, and so does a kernel killed with SIGKILL; a rank
stuck in a C call that holds the GIL never runs a Python watchdog thread.

Algorithm:
1. Rendezvous: a ``FileStore`` file per generation in a directory that
   ``tempfile.mkdtemp`` creates with mode 0700; the kernel removes it at close. No
   socket: other users of the machine cannot open it (root and our own user can).
2. gloo: the rank sets ``GLOO_SOCKET_IFNAME`` to the loopback interface before it
   creates a process group (also covers ``new_group`` and device meshes).
3. First thing in the rank: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (Linux), then a
   re-check of ``os.getppid()`` (the parent may have died before the call). The
   kernel delivers the signal: no Python, no GIL needed.
4. The rank calls ``setsid()``: it leads a process group of its own, which its
   children join. The kernel kills that whole group when it stops a rank or sees one
   die (``kill_group``), and a *group reaper* in the group (forked by the rank while
   it has one thread; its own PDEATHSIG tells it when the rank died) kills the group
   when the rank dies while the kernel cannot, e.g. after kill -9 of the kernel.
5. Every socket the rank inherited is replaced by ``/dev/null`` (``dup2``), except
   the control pipe, and the signal wakeup fd is reset. Replaced, not closed: a
   stale inherited Python object closing "its" number later (or a signal handler
   writing to it) must not hit a socket the rank opened since. spawn and forkserver
   children inherit nothing, the scan finds no socket there.
6. Every rank also runs a watchdog thread that polls ``os.getppid()`` and kills its
   group: the only line where PDEATHSIG is missing, a second one where it is not.

Caveats:
* PDEATHSIG fires when the *thread* that forked the rank exits, not the process.
  Ranks are started on the caller's thread: ``Cluster()``, ``restart()``, and
  ``run.wait()``/``cluster.run()`` (restart after a failure) on the notebook's main
  thread, and from ``ui.live`` polling, which runs on the kernel's event loop (also
  the main thread). Nothing in the package starts ranks from a thread of its own. A
  cluster created or restarted from another thread gets no PDEATHSIG (that thread
  may end long before the kernel): the watchdog alone covers it.
* With forkserver the rank's parent is the fork server, which exits when the kernel
  dies; PDEATHSIG and the watchdog follow the fork server.
* Elsewhere (macOS) there is no PDEATHSIG and no reaper, only the watchdog; a rank
  holding the GIL defeats it.
* A child that leaves the rank's process group (``setsid``, ``start_new_session``)
  is not covered. A kernel killed with SIGKILL leaves its rendezvous directory (one
  small file) in the temporary directory.
* Root and our own user can still read and write the rendezvous file (and ptrace
  the ranks); any local user can connect to gloo's loopback sockets while a group
  lives (gloo has no authentication).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


# -- kernel side -----------------------------------------------------------------------------
_RENDEZVOUS_PREFIX = "ish-rendezvous-"


def sweep_stale_rendezvous() -> list[str]:
    """Remove the rendezvous directories (ours) of kernels that died without closing
    their cluster (killed with SIGKILL, a notebook's kernel restart); returns them.

    A directory is stale when the kernel whose pid it is named for is gone. A pid
    reused since by another process keeps its directory until that one ends: harmless.
    """
    removed = []
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            pid = name[len(_RENDEZVOUS_PREFIX) :].partition("-")[0]
            if not (name.startswith(_RENDEZVOUS_PREFIX) and pid.isdigit()):
                continue
            path = os.path.join(root, name)
            try:
                if os.lstat(path).st_uid != os.getuid() or _alive(int(pid)):
                    continue
            except OSError:
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Rendezvous:
    """A private directory holding one ``FileStore`` file per generation of ranks."""

    def __init__(self) -> None:
        sweep_stale_rendezvous()
        # mode 0700, ours; named for this kernel, so a later one can tell it is stale
        self.path = tempfile.mkdtemp(prefix=f"{_RENDEZVOUS_PREFIX}{os.getpid()}-")

    def store_file(self, generation: int) -> str:
        """The file of a new generation; earlier generations' files go (all stopped)."""
        for name in os.listdir(self.path):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.path, name))
        return os.path.join(self.path, f"gen{generation}")

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def pdeathsig_is_safe(start_method: str) -> bool:
    """PDEATHSIG follows the forking thread: only arm it when that thread lasts."""
    return start_method == "forkserver" or threading.current_thread() is threading.main_thread()


def kill_group(pid: int, sig: int = signal.SIGKILL, *, leader: bool = True) -> None:
    """Signal a rank's process group (its id is the rank's pid, see ``own_session``)
    and, when ``leader`` (it is not reaped yet), the rank itself: before ``setsid()``
    ran in it there is no group to signal."""
    kills = (os.killpg, os.kill) if leader else (os.killpg,)
    for kill in kills:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, sig)


# -- rank side -------------------------------------------------------------------------------
def die_with_parent(parent_pid: int, *, pdeathsig: bool) -> int:
    """Make sure this rank dies with ``parent_pid`` (0: the parent it has now); return
    that pid, for ``watch_parent``."""
    parent = parent_pid or os.getppid()
    if pdeathsig and _libc is not None:
        if _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL)) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent:  # it died before we could ask to follow it
        os._exit(1)
    return parent


def watch_parent(parent: int) -> None:
    """Fallback without PDEATHSIG (and a second line with it): poll for the parent."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        if os.getpgrp() == os.getpid():
            os.killpg(0, signal.SIGKILL)  # the rank and its children
        os._exit(1)

    threading.Thread(target=watch, name="ish-parent-watch", daemon=True).start()


def own_session() -> None:
    """Lead a new session and process group, so the rank's children can be found."""
    try:
        os.setsid()
    except OSError:  # already a group leader: keep going, kill_group then finds no group
        log.debug("setsid failed", exc_info=True)


def start_group_reaper() -> int | None:
    """Fork the process that kills this rank's group once the rank died (Linux).

    Forked, not exec'd: a fresh interpreter costs tens of ms of CPU at launch, a fork
    of the still single-threaded rank a millisecond (its pages stay shared).
    """
    leader = os.getpid()
    if _libc is None or os.getpgrp() != leader:
        return None  # not our own group: killing it could take the kernel with it
    if threading.active_count() > 1:
        log.warning("not starting the group reaper: a rank with threads must not fork")
        return None
    pid = os.fork()
    if pid:
        return pid
    try:  # the reaper: touch none of the rank's state, never return into it
        _reap_group(leader)
    finally:
        os._exit(0)


def _reap_group(leader: int) -> None:
    import gc

    gc.disable()  # no finalizer of the rank's objects runs here
    # Hold nothing of the rank's: the kernel sees a rank's death by EOF on its pipes.
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))
    assert _libc is not None
    _libc.prctl(_PR_SET_NAME, b"ish-reaper")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    _libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGHUP))  # when the rank dies
    while os.getppid() == leader:
        signal.sigwait({signal.SIGHUP})
    if os.getpgrp() == leader:
        os.killpg(leader, signal.SIGKILL)


def drop_inherited_sockets(keep: set[int]) -> int:
    """Replace every socket descriptor but ``keep`` (and 0-2) by /dev/null; how many."""
    folder = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    with contextlib.suppress(ValueError, OSError):  # a signal would write to a zmq socket
        signal.set_wakeup_fd(-1)
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    dropped = 0
    try:
        for name in os.listdir(folder):
            fd = int(name)
            if fd <= 2 or fd in keep or fd == devnull:
                continue
            try:
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
            except OSError:  # the listing's own descriptor, already closed
                continue
            os.dup2(devnull, fd, inheritable=False)
            dropped += 1
    finally:
        os.close(devnull)
    return dropped


def loopback_interface() -> str | None:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS), if any."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return next((n for n in names if n.startswith("lo")), None)


def keep_collectives_on_loopback() -> None:
    """Make gloo (and NCCL's bootstrap) sockets of this rank bind to loopback.

    Both libraries read these variables when a process group is created; a
    single-machine cluster never needs another interface, whatever the user's
    environment says (it may be set for multi-host jobs).
    """
    name = loopback_interface()
    if name is None:
        log.warning("no loopback interface found; gloo picks its own address")
        return
    os.environ["GLOO_SOCKET_IFNAME"] = name
    os.environ["NCCL_SOCKET_IFNAME"] = name
