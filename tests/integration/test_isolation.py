"""A cluster keeps to itself: loopback-only sockets, a private rendezvous, no inherited
sockets, and no process left behind (not even a rank's own children).

See Note [Rank isolation] in interactive_shard/cluster/isolation.py.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest

import interactive_shard as ish

# Ports this test process listened on before the cluster started: gloo keeps a
# listener for the life of a process that ever made a process group (torch 2.13), and
# other test modules make one-rank groups in this process.
BEFORE: set[int] = set()


CLUSTER = {"timeout": 20, "echo": False}  # the shared fixture's options (conftest.py)


@pytest.fixture(scope="module", autouse=True)
def ports_before_the_cluster() -> None:
    """Autouse, so it runs before the module's ``cluster`` starts."""
    BEFORE.update(p for _, p in listening(os.getpid()))


def rank_pids(cluster: ish.Cluster) -> list[int]:
    return cluster.run(lambda ctx: os.getpid()).results


def listening(pid: int) -> list[tuple[str, int]]:
    conns = psutil.Process(pid).net_connections(kind="inet")
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_all_die(pids: list[int], within: float, what: str) -> None:
    """Wait for ``pids`` to die; kill the survivors (so a failure leaves nothing) and fail."""
    deadline = time.monotonic() + within
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        psutil.Process(pid).kill()
    assert not left, f"{what}: {left} still alive after {within} s"


def non_loopback_interface() -> str | None:
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family == socket.AF_INET and not ipaddress.ip_address(addr.address).is_loopback:
                return name
    return None


# -- 1. the rendezvous is ours alone ---------------------------------------------------------
def test_kernel_and_ranks_listen_on_loopback_only(cluster: ish.Cluster) -> None:
    for pid in [os.getpid(), *rank_pids(cluster)]:
        for ip, port in listening(pid):
            assert ipaddress.ip_address(ip).is_loopback, f"pid {pid} listens on {ip}:{port}"


def test_gloo_stays_on_loopback_whatever_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A machine whose hostname resolves to its LAN address makes gloo listen there;
    # naming that interface in the environment does the same on any machine.
    iface = non_loopback_interface()
    if iface is None:
        pytest.skip("this machine has no non-loopback IPv4 interface")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", iface)
    with ish.Cluster(2, timeout=20, echo=False) as c:
        for pid in rank_pids(c):
            assert listening(pid), "gloo should listen somewhere"
            for ip, port in listening(pid):
                assert ipaddress.ip_address(ip).is_loopback, f"rank listens on {ip}:{port}"


def test_the_kernel_listens_for_nothing_but_telemetry(cluster: ish.Cluster) -> None:
    # No TCP store: nothing on the machine can connect to the rendezvous.
    port = int(cluster.telemetry[0].rsplit(":", 1)[1])
    assert [p for _, p in listening(os.getpid()) if p not in BEFORE] == [port]


def test_the_rendezvous_is_a_private_directory(cluster: ish.Cluster) -> None:
    folder = Path(cluster._res.rendezvous.path)  # an implementation detail, on purpose
    info = folder.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert any(folder.iterdir()), "the ranks' store file lives here"
    if os.getuid() != 0:
        return  # another user cannot be impersonated without root
    files = [str(folder), *map(str, folder.iterdir())]
    done = subprocess.run(["ls", *files], user="nobody", capture_output=True, text=True)
    assert done.returncode != 0 and "Permission denied" in done.stderr, done.stdout


def test_the_rendezvous_is_removed_at_close() -> None:
    c = ish.Cluster(2, timeout=20, echo=False)
    folder = Path(c._res.rendezvous.path)
    assert folder.is_dir()
    c.close()
    assert not folder.exists()


def test_ranks_hold_no_socket_of_the_kernel() -> None:
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        inode = os.readlink(f"/proc/self/fd/{mine.fileno()}")
        with ish.Cluster(2, timeout=20, echo=False) as c:
            kernel = socket_inodes(os.getpid())
            assert inode in kernel
            for pid in rank_pids(c):
                shared = socket_inodes(pid) & kernel
                assert not shared, f"rank {pid} holds the kernel's sockets {sorted(shared)}"


# -- 2. no process left behind ---------------------------------------------------------------
def start_child(ctx) -> int:
    import subprocess

    ctx.state["child"] = subprocess.Popen(["sleep", "1000"])
    return ctx.state["child"].pid


def test_a_ranks_children_die_at_close() -> None:
    c = ish.Cluster(2, timeout=20, echo=False)
    children = c.run(start_child).results
    c.close()
    assert_all_die(children, 2, "children of closed ranks")


def test_a_ranks_children_die_with_it(cluster: ish.Cluster) -> None:
    children = cluster.run(start_child).results
    pid = rank_pids(cluster)[1]
    os.kill(pid, signal.SIGKILL)
    assert_all_die([pid, children[1]], 2, "a killed rank and its child")
    with pytest.warns(RuntimeWarning, match="rank 1 was killed by SIGKILL"):
        rank_pids(cluster)  # the restart stops rank 0, its group with it
    assert_all_die([children[0]], 2, "the child of a restarted rank")


KERNEL = """
import os, sys, time, interactive_shard as ish

def stuck(ctx):
    import ctypes, subprocess
    child = subprocess.Popen(["sleep", "1000"])
    print("pids", os.getpid(), child.pid, flush=True)
    if ctx.rank == 1:
        ctypes.PyDLL(None).sleep(1000)  # a C call that holds the GIL
    time.sleep(1000)

c = ish.Cluster(2, echo=False)
run = c.run(stuck, wait=False)
while sum(line.startswith("pids") for log in c.logs for line in log) < 2:
    time.sleep(0.01)
time.sleep(0.2)  # rank 1 is inside sleep() now
pids = [int(p) for log in c.logs for line in log if line.startswith("pids")
        for p in line.split()[1:]]
print(*pids, flush=True)
time.sleep(1000)
"""


@pytest.mark.slow
def test_kill_9_of_the_kernel_takes_stuck_ranks_and_their_children(tmp_path: Path) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(textwrap.dedent(KERNEL))
    kernel = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert kernel.stdout is not None
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) == 4, pids
        everyone = pids + [c.pid for p in pids[::2] for c in psutil.Process(p).children()]
    finally:
        kernel.kill()
        kernel.wait()
    assert_all_die(everyone, 3, "ranks and their children after kill -9 of the kernel")


def test_ranks_started_on_a_thread_outlive_the_thread() -> None:
    # PDEATHSIG follows the thread that forked a rank: not armed off the main thread.
    made: list[ish.Cluster] = []
    starter = threading.Thread(target=lambda: made.append(ish.Cluster(2, echo=False)))
    starter.start()
    starter.join()
    time.sleep(0.3)
    with made[0] as c, warnings.catch_warnings():
        warnings.simplefilter("error")  # a restart warns: the ranks must not have died
        assert [s.value for s in c.rank_states] == ["idle", "idle"]
        assert len(rank_pids(c)) == 2
