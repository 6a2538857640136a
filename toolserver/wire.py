"""How requests and results travel inside Ray: raw pixels, never PNG.

Two carriers, both free of codecs (PNG encoding of a 1024^2 image alone costs tens of ms):

- **Shared memory slots**, when caller and replica share a host. The caller owns a pool of
  files under /dev/shm (`ShmPool`); it writes each input image's raw pixels into a slot and
  names a second slot for the replica's result image, and only the names travel through Ray.
  Moving the pixels through Ray's object store instead costs ~3.5 ms a call at 512^2 RGB,
  however they are passed. Slots are reused: a fresh tmpfs file costs a page allocation per
  4 KB (0.55 vs 0.2 ms per transfer at 512^2).
- **Numpy arrays**, everywhere else (another host, no /dev/shm): Ray serialises them out of
  band (pickle protocol 5) into its object store.

A replica that cannot find a request's slot (another host) answers `SHM_UNAVAILABLE`; the
caller resends that call as arrays and stops using shm for that deployment. Every file belongs
to the caller's pool, so a replica never creates or removes one and a timed-out call orphans
nothing. A caller killed outright (SIGKILL, `ray.kill`, the OOM killer) never cleans up, so
each file's name carries its owner and every new pool first removes the files of dead owners
(`sweep_orphaned_slots`). PNG/base64 exists only at the HTTP edge (`toolserver.http_codec`).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import stat
import threading
import uuid
import weakref
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from PIL import Image

from toolserver.registry import OutputKind
from toolserver.request import ToolRequest
from toolserver.results import ToolResult
from toolserver.validation import Profile

log = logging.getLogger(__name__)

# Modes whose pixels survive np.asarray -> Image.fromarray unchanged. Others (palette images,
# for instance) travel as PIL objects, which Pillow pickles as raw bytes: still no codec.
_ARRAY_MODES = frozenset({"1", "L", "LA", "RGB", "RGBA", "I", "F", "I;16"})
# Modes whose numpy layout is exactly Pillow's raw layout, so `Image.frombytes` can read the
# array's buffer directly: 5x cheaper than `Image.fromarray` at 512^2 RGB (0.1 vs 0.5 ms).
# Not mode "1": numpy holds one bool per pixel, Pillow packs bits.
_RAW_DTYPES = {m: np.dtype(d) for m, d in {"L": "u1", "LA": "u1", "RGB": "u1", "RGBA": "u1", "I": "=i4", "F": "=f4", "I;16": "<u2"}.items()}

SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "canvasagent-ts-"
# A slot's name: SHM_PREFIX + "<boot id>-<pid namespace inode>-<pid>-<start time>-<random>", the
# owner being the process whose pool created it (`_owner_tag`). Names without the owner part
# are accepted but never swept: nothing proves their owner gone (docs/serving.md: manual cleanup).
_SHM_OWNED = re.compile(rf"{SHM_PREFIX}(?P<boot>[0-9a-f]{{32}})-(?P<ns>[0-9]{{1,20}})-(?P<pid>[0-9]{{1,10}})-(?P<start>[0-9]{{1,20}})-[0-9a-f]{{32}}")
_SHM_NAME = re.compile(rf"{SHM_PREFIX}(?:[0-9a-f]{{32}}-[0-9]{{1,20}}-[0-9]{{1,10}}-[0-9]{{1,20}}-)?[0-9a-f]{{32}}")
# Below this Ray inlines the bytes in the RPC message itself, which is as cheap as a file.
SHM_MIN_BYTES = 64 * 1024
SHM_UNAVAILABLE = "shm_unavailable"  # error code: the replica cannot see the caller's /dev/shm
# Pillow holds RGB as 4 bytes a pixel: shipping that layout makes both ends a line copy, not a
# per-pixel repack (2-3x faster at 512^2), for a third more bytes through mapped memory.
_SHM_RAWMODE = {"RGB": "RGBX"}
# Freed Pillow blocks a toolserver process keeps for reuse (Pillow's default keeps none).
PILLOW_BLOCKS = 8


def keep_pillow_blocks(n: int = PILLOW_BLOCKS) -> None:
    """Let Pillow reuse freed image memory in this process instead of returning it to the OS:
    every image a call makes is fresh memory, and its first-touch page faults dominate (Flip at
    512^2 in a replica: 0.8 ms with Pillow's default, 0.22 ms with blocks reused). At most `n`
    blocks of at most PILLOW_BLOCK_SIZE (16 MB by default) stay cached; a PILLOW_BLOCKS_MAX in
    the environment (the operator's setting) wins."""
    if "PILLOW_BLOCKS_MAX" not in os.environ:
        Image.core.set_blocks_max(n)


# Bytes a pixel of each raw layout that goes through a slot or an array (mode "1" packs bits).
_RAW_BYTES_PER_PIXEL = {"RGBX": 4, "RGBA": 4, "L": 1, "LA": 2, "I": 4, "F": 4, "I;16": 2}
_ENCODE_CHUNK = 256 * 1024


def raw_size(img: Image.Image, rawmode: str) -> int:
    if rawmode == "1":
        return (img.width + 7) // 8 * img.height
    return img.width * img.height * _RAW_BYTES_PER_PIXEL[rawmode]


def encode_into(img: Image.Image, rawmode: str, out: Any) -> int:
    """Write `img.tobytes("raw", rawmode)` into the writable buffer `out`; returns the length.
    Each encoded chunk goes straight to its place in `out`: tobytes joins its chunks into a
    fresh, page-faulting buffer that a slot write copies once more (0.7 vs 0.05 ms at 512^2)."""
    img.load()
    encoder = Image._getencoder(img.mode, "raw", (rawmode, 0, 1))
    encoder.setimage(img.im, (0, 0) + img.size)
    bufsize = max(_ENCODE_CHUNK, img.width * 4)  # at least one line, or the encoder stalls
    off = 0
    while True:
        n, status, chunk = encoder.encode(bufsize)
        out[off : off + n] = chunk
        off += n
        if status:
            break
    if status < 0:
        raise RuntimeError(f"raw encoder error {status} for a {img.mode} image")
    return off


def _to_array(img: Image.Image) -> np.ndarray:
    dtype = _RAW_DTYPES.get(img.mode)
    if dtype is None:  # mode "1": numpy's one-bool-a-pixel layout is not Pillow's raw one
        return np.asarray(img)
    # np.asarray(img) goes through Image.tobytes, and with it the page-faulting join.
    bands = len(img.getbands())
    arr = np.empty((img.height, img.width) if bands == 1 else (img.height, img.width, bands), dtype)
    encode_into(img, img.mode, memoryview(arr).cast("B"))
    return arr


class ShmMissing(Exception):
    """A slot named in a request is not on this host, or is smaller than it claims."""


def shm_available() -> bool:
    return SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK)


def _start_time(pid: int | str) -> int | None:
    """The process's start time in clock ticks after boot (field 22 of /proc/PID/stat); None
    when no such process runs. A zombie counts as gone (it holds no mapping), unless only its
    main thread exited: /proc then shows the leader as a zombie while other threads run."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        # The command name (field 2) may hold spaces and parentheses; it ends at the last ")".
        fields = raw[raw.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X") and len(os.listdir(f"/proc/{pid}/task")) <= 1:
            return None
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[19])


# (pid, tag) of the process the tag was made in: a forked child makes its own.
_OWNER: tuple[int, str | None] | None = None


def _owner_tag() -> str | None:
    """This process's owner tag, "<boot id>-<pid namespace inode>-<pid>-<start time>", or None
    where /proc cannot say who we are (then names carry no owner and are never swept).

    The start time tells a recycled PID from the owner. Containers on one host share the boot
    id and may share /dev/shm (`--ipc=host`) while each has its own PIDs, so a sweep judges only
    names from its own PID namespace and leaves other containers' files alone.
    """
    global _OWNER
    pid = os.getpid()
    if _OWNER is not None and _OWNER[0] == pid:
        return _OWNER[1]
    tag = None
    with suppress(OSError, ValueError, IndexError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
        ns = os.stat("/proc/self/ns/pid").st_ino
        # /proc must be this namespace's own view (not a host /proc mounted into a container,
        # say), or the PIDs a sweep looks up there would be another table's.
        start = _start_time(pid) if os.readlink("/proc/self") == str(pid) else None
        if re.fullmatch(r"[0-9a-f]{32}", boot) and start is not None:
            tag = f"{boot}-{ns}-{pid}-{start}"
    _OWNER = (pid, tag)
    return tag


def sweep_orphaned_slots(shm_dir: Path | None = None) -> int:
    """Remove slot files whose owner process is dead; returns how many were removed.

    Only a file proven ours and orphaned goes: an owned name with this host's boot id and this
    PID namespace, a regular file of this user, and an owner PID that is not running or runs
    with another start time (a recycled PID). Anything else is never touched. Racing sweepers
    are harmless: a dead owner makes no new files.
    """
    shm_dir = SHM_DIR if shm_dir is None else shm_dir
    tag = _owner_tag()
    if tag is None:
        return 0
    boot, ns = tag.split("-")[:2]
    ours = f"{SHM_PREFIX}{boot}-{ns}-"
    try:
        names = [n for n in os.listdir(shm_dir) if n.startswith(ours)]
    except OSError:
        return 0
    alive: dict[tuple[int, int], bool] = {}
    uid = os.geteuid()
    removed = freed = 0
    for name in names:
        m = _SHM_OWNED.fullmatch(name)
        if m is None:
            continue
        owner = (int(m["pid"]), int(m["start"]))
        if owner not in alive:
            try:
                alive[owner] = _start_time(owner[0]) == owner[1]
            except (OSError, ValueError, IndexError):
                alive[owner] = True  # unreadable: not proven dead
        if alive[owner]:
            continue
        path = shm_dir / name
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                continue
            os.unlink(path)
        except FileNotFoundError:  # another sweeper was first
            continue
        except OSError as e:
            log.debug("cannot remove orphaned slot %s: %s", name, e)
            continue
        removed += 1
        freed += st.st_size
    if removed:
        log.info("removed %d shared memory slot file(s) (%.1f MB) left by dead processes", removed, freed / 1e6)
    return removed


def _shm_path(name: str) -> Path:
    # The name comes from another process: only our own flat names, never a path.
    if not _SHM_NAME.fullmatch(name):
        raise ShmMissing(f"not a toolserver shm name: {name!r:.80}")
    return SHM_DIR / name


def _open_slot(name: str, flags: int) -> int:
    try:
        return os.open(_shm_path(name), flags)
    except FileNotFoundError:
        raise ShmMissing(f"{name} is not in {SHM_DIR} on this host") from None
    except OSError as e:  # another user's file (separate containers), ...: fall back to arrays
        raise ShmMissing(f"cannot open {name}: {e}") from None


class _Mapped:
    """Another process's slot, kept open and mapped by a replica between calls."""

    def __init__(self, name: str, writable: bool):
        self.fd = _open_slot(name, os.O_RDWR if writable else os.O_RDONLY)
        self.writable = writable
        self.mm: mmap.mmap | None = None

    def gone(self) -> bool:
        return os.fstat(self.fd).st_nlink == 0  # its owner removed it

    def map(self, n: int, grow: bool) -> mmap.mmap:
        size = os.fstat(self.fd).st_size
        if size < n:
            if not grow:
                raise ShmMissing(f"slot holds {size} bytes, fewer than the {n} claimed")
            os.ftruncate(self.fd, n)
            size = n
        if self.mm is None or len(self.mm) < size:  # first use, or grown (by either side)
            self.close_map()
            self.mm = mmap.mmap(self.fd, size, prot=mmap.PROT_READ | (mmap.PROT_WRITE if self.writable else 0))
        return self.mm

    def read_image(self, mode: str, size: tuple[int, int], nbytes: int, rawmode: str | None = None) -> Image.Image:
        # frombytes decodes straight from the mapping into Pillow's own storage: one copy.
        with memoryview(self.map(nbytes, grow=False))[:nbytes] as view:
            return Image.frombytes(mode, size, view, "raw", rawmode or mode)

    def write_image(self, img: Image.Image, rawmode: str, nbytes: int) -> None:
        encode_into(img, rawmode, self.map(nbytes, grow=True))

    def close_map(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None

    def close(self) -> None:
        self.close_map()
        os.close(self.fd)


class _SlotCache:
    """A replica's open mappings of callers' slots, most recent last: callers reuse their
    slots, so each is opened and mapped once (half the cost per transfer). Bounded in count and
    size; a slot its owner removed is dropped, so removed files do not stay pinned."""

    def __init__(self, max_entries: int = 32, max_bytes: int = 64 * 1024 * 1024):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._slots: dict[str, _Mapped] = {}
        self._lock = threading.Lock()  # replicas run tools on worker threads too

    @contextmanager
    def use(self, name: str, n: int, write: bool) -> Iterator[_Mapped]:
        """The mapping for `name`, held under the lock so no other thread evicts it mid-copy
        (a replica's slot I/O is a memcpy; serialising it costs nothing worth a refcount)."""
        with self._lock:
            for key, m in list(self._slots.items()):
                if m.gone():
                    m.close()
                    del self._slots[key]
            m = self._slots.pop(name, None)
            if m is not None and write and not m.writable:
                m.close()
                m = None
            if m is None:
                m = _Mapped(name, write)
            try:
                yield m
            except BaseException:
                m.close()
                raise
            if n > self.max_bytes:
                m.close()
                return
            self._slots[name] = m
            while len(self._slots) > self.max_entries:
                self._slots.pop(next(iter(self._slots))).close()


_CACHE = _SlotCache()


class ShmSlot(_Mapped):
    """One file of the caller's pool, kept mapped so reuse costs a memcpy, not page faults."""

    def __init__(self) -> None:
        tag = _owner_tag()
        self.name = f"{SHM_PREFIX}{tag}-{uuid.uuid4().hex}" if tag else SHM_PREFIX + uuid.uuid4().hex
        # O_EXCL and 0600: never write through someone else's file or link.
        self.fd = os.open(SHM_DIR / self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.writable, self.mm = True, None

    @property
    def capacity(self) -> int:
        return os.fstat(self.fd).st_size

    def remove(self) -> None:
        self.close()
        with suppress(FileNotFoundError):
            os.unlink(SHM_DIR / self.name)


class ShmPool:
    """The caller's slots: taken per call, given back after it, removed on `close()`.

    A slot whose call timed out is removed, not reused: its replica may still be using it.
    Thread-safe (a toolbox serves many rollout threads). Creating a pool first sweeps dead
    owners' files (`sweep_orphaned_slots`), so a restarted ingress or client cleans up after
    the one that was killed.
    """

    def __init__(self, max_free: int = 16, max_pooled_bytes: int = 64 * 1024 * 1024):
        sweep_orphaned_slots()
        self.max_free, self.max_pooled_bytes = max_free, max_pooled_bytes
        self._free: list[ShmSlot] = []
        self._all: dict[str, ShmSlot] = {}
        self._lock = threading.Lock()
        self._closed = False
        # Removes the files even if the owner forgets close(), e.g. at interpreter exit.
        self._finalizer = weakref.finalize(self, ShmPool._remove_all, self._all)

    def acquire(self) -> ShmSlot:
        with self._lock:
            if self._free:
                return self._free.pop()
            slot = ShmSlot()
            self._all[slot.name] = slot
            return slot

    def get(self, name: str) -> ShmSlot | None:
        return self._all.get(name)

    def release(self, slot: ShmSlot, reuse: bool = True) -> None:
        with self._lock:
            if reuse and not self._closed and len(self._free) < self.max_free and slot.capacity <= self.max_pooled_bytes:
                self._free.append(slot)
                return
            self._all.pop(slot.name, None)
        slot.remove()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._free.clear()
        self._finalizer()

    @staticmethod
    def _remove_all(slots: dict[str, ShmSlot]) -> None:
        for slot in list(slots.values()):
            slot.remove()
        slots.clear()


@dataclass
class WireImage:
    mode: str
    array: np.ndarray | None = None
    pil: Image.Image | None = None
    shm: str | None = None  # name of a slot holding `tobytes("raw", rawmode)`
    size: tuple[int, int] = (0, 0)
    nbytes: int = 0
    rawmode: str | None = None  # the slot's pixel layout; None: the mode's own

    @classmethod
    def pack(cls, img: Image.Image, pool: ShmPool | None = None, slot: str | None = None) -> "WireImage":
        """Into a new slot of `pool` (a caller), or into the named `slot` (a replica's reply)."""
        rawmode = _SHM_RAWMODE.get(img.mode, img.mode)
        if img.mode in _ARRAY_MODES and (pool is not None or slot is not None):
            nbytes = raw_size(img, rawmode)
            if nbytes >= SHM_MIN_BYTES:
                try:
                    if pool is not None:
                        taken = pool.acquire()
                        try:
                            taken.write_image(img, rawmode, nbytes)
                        except BaseException:
                            # Nothing will name this slot to release it later.
                            pool.release(taken, reuse=False)
                            raise
                        slot = taken.name
                    else:  # a replica's reply, into the caller's slot (grown if needed)
                        with _CACHE.use(slot, nbytes, write=True) as m:  # type: ignore[arg-type]
                            m.write_image(img, rawmode, nbytes)
                    return cls(img.mode, shm=slot, size=img.size, nbytes=nbytes, rawmode=rawmode)
                except (OSError, ShmMissing) as e:  # /dev/shm full, or the slot is gone
                    log.warning("shared memory write failed (%s); sending the image as an array", e)
        if img.mode in _ARRAY_MODES:
            return cls(img.mode, array=_to_array(img))
        return cls(img.mode, pil=img)

    def unpack(self, pool: ShmPool | None = None) -> Image.Image:
        if self.pil is not None:
            return self.pil
        if self.shm is not None:
            own = pool.get(self.shm) if pool is not None else None
            if own is not None:  # our own slot: already mapped
                return own.read_image(self.mode, self.size, self.nbytes, self.rawmode)
            with _CACHE.use(self.shm, self.nbytes, write=False) as m:  # a replica reading its request
                return m.read_image(self.mode, self.size, self.nbytes, self.rawmode)
        arr = self.array
        assert arr is not None
        if _RAW_DTYPES.get(self.mode) == arr.dtype and arr.flags.c_contiguous and arr.ndim in (2, 3):
            # Arrays from Ray's object store are read-only; frombytes copies, so the image is
            # writable and does not pin the object store buffer.
            return Image.frombytes(self.mode, (arr.shape[1], arr.shape[0]), arr)
        # fromarray infers exactly these modes from dtype and shape (checked in the tests).
        return Image.fromarray(arr)


@dataclass
class WireRequest:
    tool: str
    args: dict[str, Any]
    images: dict[str, WireImage] = field(default_factory=dict)
    raw_args: dict[str, Any] = field(default_factory=dict)
    profile: str = Profile.CANVASCRAFT.value
    reply_slot: str | None = None  # where the replica writes a result image (same host only)

    @classmethod
    def pack(cls, req: ToolRequest, pool: ShmPool | None = None) -> "WireRequest":
        wire = cls(req.tool, req.args, {}, req.raw_args, Profile(req.profile).value)
        try:
            for k, v in req.images.items():
                wire.images[k] = WireImage.pack(v, pool)
            if wire.uses_shm:
                assert pool is not None
                wire.reply_slot = pool.acquire().name
        except BaseException:
            wire.release(pool, reuse=False)  # a half-packed request must not keep slots
            raise
        return wire

    @property
    def uses_shm(self) -> bool:
        return any(w.shm is not None for w in self.images.values())

    def unpack(self) -> ToolRequest:
        """For the replica; raises ShmMissing when a slot is not on this host."""
        return ToolRequest(self.tool, self.args, {k: v.unpack() for k, v in self.images.items()}, self.raw_args, Profile(self.profile))

    def release(self, pool: ShmPool | None, reuse: bool = True) -> None:
        """Give this call's slots back to the caller's pool once the call is over; `reuse=False`
        when a replica may still be using them (the call timed out)."""
        if pool is None:
            return
        for name in [w.shm for w in self.images.values()] + [self.reply_slot]:
            slot = pool.get(name) if name else None
            if slot is not None:
                pool.release(slot, reuse)


@dataclass
class WireResult:
    ok: bool
    text: str
    kind: str = OutputKind.NONE.value
    image: WireImage | None = None
    data: dict[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    plumbing_only: bool = False
    backend: str | None = None
    elapsed_s: float = 0.0

    @classmethod
    def pack(cls, r: ToolResult, reply_slot: str | None = None) -> "WireResult":
        img = WireImage.pack(r.image, slot=reply_slot) if r.image is not None else None
        return cls(r.ok, r.text, OutputKind(r.kind).value, img, r.data, r.error_code, r.plumbing_only, r.backend, r.elapsed_s)

    def unpack(self, pool: ShmPool | None = None) -> ToolResult:
        """For the caller; call before releasing the request's slots (the image is in one)."""
        img = self.image.unpack(pool) if self.image is not None else None
        return ToolResult(
            self.ok, self.text, OutputKind(self.kind), img, dict(self.data), self.error_code, self.plumbing_only, self.backend, self.elapsed_s
        )
