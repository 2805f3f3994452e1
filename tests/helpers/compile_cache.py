"""The test suite's own inductor cache: a directory no other program uses,
wiped when an earlier session did not finish (killed, Ctrl-C), so a
half-written compile never poisons a later run, and kept otherwise, so a
run pays only the compiles it has not made before.

torch.compile's inductor keeps compiled kernels across processes in
``TORCHINDUCTOR_CACHE_DIR`` (``/tmp/torchinductor_<user>`` by default,
shared by every program of the user): C++ sources, the ``.so`` / ``.o``
files compiled from them, the FX-graph and AOT-autograd caches that point
at them, Triton's cache on CUDA. It builds a binary only if its path does
not exist (``codecache._worker_compile_cpp``), so a compiler killed while
it wrote the file leaves a binary that every later run loads and fails on
(``ImportError: ... .so: file too short``).

Each pytest process (the session and each xdist worker) holds a shared
``flock`` on ``.sessions.lock`` and a marker file in ``.sessions/`` while
it runs, and removes its marker when it finishes without an interruption.
A session that starts alone (its exclusive ``flock`` granted: no other
session is live) and finds a marker knows an earlier one was cut short:
it empties the directory. Alone and without a marker, it still removes
every ``.so`` / ``.o`` that is not a complete ELF file (written by a
process outside a session, or by a killed rank process). A session that
starts beside a live one leaves the directory alone.
"""
import os
import os.path as osp
import shutil
import struct
import tempfile
import uuid
from typing import List, NamedTuple, Optional

try:
    import fcntl
except ImportError:  # not POSIX: no locking, nothing wiped
    fcntl = None

LOCK = '.sessions.lock'
MARKERS = '.sessions'
BINARIES = ('.so', '.o')

#: set by the suite's first process: ``'1'`` where the user gave
#: ``TORCHINDUCTOR_CACHE_DIR`` (the suite uses it as it is), ``'0'`` where
#: the suite's own directory is used
USER_CACHE_FLAG = 'MMSTATS_TESTS_USER_INDUCTOR_CACHE'


def suite_cache_dir() -> str:
    """The suite's inductor cache (in the temp dir, per user).

    Example:
        >>> 'mmstats-tests-inductor' in suite_cache_dir()
        True
    """
    try:
        user = str(os.getuid())
    except AttributeError:
        user = 'user'
    return osp.join(tempfile.gettempdir(), f'mmstats-tests-inductor-{user}')


def complete_elf(path: str) -> bool:
    """Whether ``path`` is an ELF file whose program and section header
    tables and every segment lie inside it (a truncated or empty binary
    does not).

    Example:
        >>> import sys, tempfile
        >>> with tempfile.NamedTemporaryFile(suffix='.so') as f:
        ...     complete_elf(f.name)  # empty
        False
    """
    try:
        size = osp.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b'\x7fELF':
                return False
            wide, order = head[4] == 2, '<' if head[5] == 1 else '>'
            if wide and len(head) < 64:
                return False
            if wide:
                phoff, shoff = struct.unpack(order + 'QQ', head[32:48])
                phentsize, phnum, shentsize, shnum = struct.unpack(
                    order + 'HHHH', head[54:62])
            else:
                phoff, shoff = struct.unpack(order + 'II', head[28:36])
                phentsize, phnum, shentsize, shnum = struct.unpack(
                    order + 'HHHH', head[42:50])
            if phoff + phentsize * phnum > size:
                return False
            if shoff + shentsize * shnum > size:
                return False
            for i in range(phnum):  # every segment's bytes in the file
                f.seek(phoff + i * phentsize)
                entry = f.read(phentsize)
                if wide:  # p_offset, p_filesz
                    offset, = struct.unpack(order + 'Q', entry[8:16])
                    filesz, = struct.unpack(order + 'Q', entry[32:40])
                else:
                    offset, = struct.unpack(order + 'I', entry[4:8])
                    filesz, = struct.unpack(order + 'I', entry[16:20])
                if offset + filesz > size:
                    return False
    except (OSError, struct.error):
        return False
    return True


def incomplete_binaries(directory: str) -> List[str]:
    """The ``.so`` / ``.o`` files under ``directory`` that are not complete
    ELF files.

    Example:
        >>> import tempfile
        >>> incomplete_binaries(tempfile.mkdtemp())
        []
    """
    return sorted(
        osp.join(root, name) for root, _, names in os.walk(directory)
        for name in names
        if name.endswith(BINARIES) and not complete_elf(osp.join(root, name)))


class CacheSession(NamedTuple):
    """One pytest process's hold on the cache: ``lock`` (the open lock
    file), ``marker`` (its marker file), ``cleaned`` (what it found:
    ``'wiped: ...'``, ``'removed N incomplete binaries'``, ``'kept'`` or
    ``'shared with a live session'``).

    Example:
        >>> import tempfile
        >>> session = open_cache(tempfile.mkdtemp())
        >>> session.cleaned
        'kept'
        >>> close_cache(session, finished=True)
    """
    lock: Optional[object]
    marker: Optional[str]
    cleaned: str


def _wipe(directory: str) -> None:
    for name in os.listdir(directory):
        if name in (LOCK, MARKERS):
            continue
        path = osp.join(directory, name)
        if osp.isdir(path) and not osp.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.remove(path)
            except OSError:
                pass


def open_cache(directory: str) -> CacheSession:
    """Join the cache in ``directory`` (created if needed); alone, empty
    it after an unfinished session, else remove incomplete binaries.
    Hold the result until :func:`close_cache`."""
    markers = osp.join(directory, MARKERS)
    os.makedirs(markers, exist_ok=True)
    if fcntl is None:
        return CacheSession(None, None, 'not locked (no fcntl)')
    lock = open(osp.join(directory, LOCK), 'a')
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        alone = True
    except OSError:
        alone = False
    cleaned = 'shared with a live session'
    if alone:
        left = os.listdir(markers)
        if left:
            _wipe(directory)
            for name in left:
                os.remove(osp.join(markers, name))
            cleaned = (f'wiped: {len(left)} earlier pytest process(es) did '
                       'not finish')
        else:
            bad = incomplete_binaries(directory)
            for path in bad:
                os.remove(path)
            noun = 'binary' if len(bad) == 1 else 'binaries'
            cleaned = 'kept'
            if bad:
                cleaned = f'removed {len(bad)} incomplete {noun}'
    fcntl.flock(lock, fcntl.LOCK_SH)  # from exclusive: others may join
    marker = osp.join(markers, f'{os.getpid()}-{uuid.uuid4().hex[:8]}')
    open(marker, 'w').close()
    return CacheSession(lock, marker, cleaned)


def close_cache(session: CacheSession, finished: bool) -> None:
    """Leave the cache: the marker removed if the process ``finished``
    (not interrupted: a compile may have been cut short), the lock
    released."""
    if finished and session.marker is not None:
        try:
            os.remove(session.marker)
        except OSError:
            pass
    if session.lock is not None:
        session.lock.close()
