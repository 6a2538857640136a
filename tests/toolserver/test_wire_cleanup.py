"""Slot files of killed owners: the next pool sweeps them, and nothing else.

Real processes and the real /dev/shm: a child makes slots and is SIGKILLed (what `ray.kill` or
the OOM killer does to an ingress or a client), so its cleanup never runs. Other engineers'
toolservers may share this /dev/shm, so every check names the files it made; none looks at
the whole directory. The Ray Serve case (a killed ingress) is in test_serve.py, which already
has the app running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from toolserver import wire
from toolserver.wire import SHM_DIR, SHM_PREFIX, ShmPool, shm_available, sweep_orphaned_slots

pytestmark = pytest.mark.skipif(not shm_available() or wire._owner_tag() is None, reason="needs /dev/shm and Linux /proc")

# Makes a pool, fills three slots (an image each, over the shm threshold), prints their names,
# then waits: on a line from stdin it closes the pool and exits, as a graceful owner does.
CHILD = """
import sys
from PIL import Image
from toolserver.wire import ShmPool, WireImage
pool = ShmPool()
names = [WireImage.pack(Image.new("RGB", (200, 200), "red"), pool).shm for _ in range(3)]
print(" ".join(names), flush=True)
sys.stdin.readline()
pool.close()
"""


# The same, but then its main thread ends while another thread runs on: /proc shows the
# leader as a zombie although the process is alive.
CHILD_LEADER_EXITS = CHILD.replace(
    "sys.stdin.readline()",
    "import ctypes, threading\nthreading.Thread(target=sys.stdin.readline).start()\nctypes.CDLL(None).pthread_exit(None)",
)


def _child(code: str = CHILD) -> tuple[subprocess.Popen, list[Path]]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert proc.poll() is None, "the child died before making its slots"
    paths = [SHM_DIR / n for n in line.split()]
    assert len(paths) == 3 and all(p.is_file() for p in paths), line
    # Its own tag, so the child's names are the scheme under test, not the legacy fallback.
    assert all(wire._SHM_OWNED.fullmatch(p.name) and f"-{proc.pid}-" in p.name for p in paths), line
    return proc, paths


def test_a_killed_owner_leaves_its_slots_and_the_next_pool_sweeps_them():
    proc, paths = _child()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert all(p.exists() for p in paths)  # the leak: no cleanup ran
    ShmPool().close()
    assert not any(p.exists() for p in paths)


def test_a_killed_but_unreaped_owner_counts_as_dead():
    """A zombie holds no mappings and never acts again; its parent may be slow to reap it."""
    proc, paths = _child()
    proc.send_signal(signal.SIGKILL)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, left a zombie
    try:
        assert wire._start_time(proc.pid) is None
        sweep_orphaned_slots()
        assert not any(p.exists() for p in paths)
    finally:
        proc.wait(timeout=30)


def test_an_owner_whose_main_thread_exited_is_alive():
    proc, paths = _child(CHILD_LEADER_EXITS)
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
            assert time.monotonic() < deadline, "the main thread did not exit"
            time.sleep(0.05)
        sweep_orphaned_slots()
        assert all(p.exists() for p in paths)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    sweep_orphaned_slots()
    assert not any(p.exists() for p in paths)


def test_a_live_owner_keeps_its_slots():
    proc, paths = _child()
    try:
        ShmPool().close()
        assert all(p.exists() for p in paths)
    finally:
        proc.communicate("close\n", timeout=30)
    assert proc.returncode == 0
    assert not any(p.exists() for p in paths)  # its own close() removed them


def test_only_our_dead_owners_files_are_swept():
    """Names from another host boot or PID namespace (a container sharing /dev/shm), the
    earlier scheme, near misses, links and directories all stay; a recycled PID does not."""
    tag = wire._owner_tag()
    boot, ns, pid, start = tag.split("-")
    rand = uuid.uuid4().hex
    other_boot = uuid.uuid4().hex
    # This process's PID with another start time: the owner is dead and its PID reused (by us).
    recycled = SHM_DIR / f"{SHM_PREFIX}{boot}-{ns}-{pid}-{int(start) + 1}-{rand}"
    dead = f"{int(start) + 1}"  # any owner named with this start time is not running
    foreign = {
        "other_host": f"{SHM_PREFIX}{other_boot}-{ns}-{pid}-{dead}-{rand}",
        "other_pidns": f"{SHM_PREFIX}{boot}-{int(ns) + 1}-{pid}-{dead}-{rand}",
        "legacy": f"{SHM_PREFIX}{rand}",
        "suffix": f"{SHM_PREFIX}{boot}-{ns}-{pid}-{dead}-{rand}.bak",
        "short_random": f"{SHM_PREFIX}{boot}-{ns}-{pid}-{dead}-{rand[:16]}",
        "not_ours": f"someone-else-{boot}-{ns}-{pid}-{dead}-{rand}",
    }
    link = SHM_DIR / f"{SHM_PREFIX}{boot}-{ns}-{pid}-{dead}-{uuid.uuid4().hex}"
    directory = SHM_DIR / f"{SHM_PREFIX}{boot}-{ns}-{pid}-{dead}-{uuid.uuid4().hex}"
    made = [recycled, link, directory] + [SHM_DIR / n for n in foreign.values()]
    try:
        for p in [recycled] + [SHM_DIR / n for n in foreign.values()]:
            p.write_bytes(b"x" * 4096)
        link.symlink_to(SHM_DIR / foreign["legacy"])
        directory.mkdir()
        sweep_orphaned_slots()
        assert not recycled.exists()
        kept = {k: (SHM_DIR / n).exists() for k, n in foreign.items()}
        assert all(kept.values()), kept
        assert link.is_symlink() and directory.is_dir()
    finally:
        for p in made:
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            elif p.is_symlink() or p.exists():
                p.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_another_users_file_stays():
    boot, ns, pid, start = wire._owner_tag().split("-")
    path = SHM_DIR / f"{SHM_PREFIX}{boot}-{ns}-{pid}-{int(start) + 1}-{uuid.uuid4().hex}"
    try:
        path.write_bytes(b"x")
        os.chown(path, 65534, 65534)
        sweep_orphaned_slots()
        assert path.exists()
    finally:
        path.unlink(missing_ok=True)


def test_names_carry_the_owner_and_replicas_accept_both_schemes():
    pool = ShmPool()
    try:
        slot = pool.acquire()
        m = wire._SHM_OWNED.fullmatch(slot.name)
        assert m and int(m["pid"]) == os.getpid() and int(m["start"]) == wire._start_time(os.getpid())
        assert wire._shm_path(slot.name) == SHM_DIR / slot.name
        assert wire._shm_path(SHM_PREFIX + uuid.uuid4().hex).parent == SHM_DIR  # an older caller's name
        with pytest.raises(wire.ShmMissing):
            wire._shm_path(slot.name + "/../../etc/passwd")
    finally:
        pool.close()
