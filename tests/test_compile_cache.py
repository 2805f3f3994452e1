"""The suite's own inductor cache (tests/helpers/compile_cache.py): a
zero-byte ``.so`` left by a killed compile poisons the next run of a real
``torch.compile`` and is removed when a session starts; a session that did
not finish empties the cache for the next; a live session's cache is left
alone; this session compiles into the suite's directory."""
import os
import os.path as osp
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.compile_cache import (MARKERS, USER_CACHE_FLAG, close_cache,
                                         complete_elf, incomplete_binaries,
                                         open_cache, suite_cache_dir)
from tests.helpers.torch_versions import needs_torch

COMPILE = textwrap.dedent("""
    import torch

    @torch.compile
    def f(x):
        return (x.sin() * 2 + 1).sum()

    print('result', float(f(torch.ones(8))))
    """)


def _compile(cache: str) -> subprocess.CompletedProcess:
    """A fresh interpreter compiling a small function into ``cache``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    return subprocess.run([sys.executable, '-c', COMPILE],
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=600)


def _seed_cpu_probes(cache: str) -> int:
    """Copy inductor's CPU probes from the suite's cache into ``cache``:
    the small C++ programs it compiles once per cache to learn which
    vector instructions build and load (ten ``*_chk_kernel`` sources and
    their ``.so``: 10 s of g++), complete binaries only. The test then
    compiles its own kernel and nothing else. Returns how many it copied
    (none in a cache that has not compiled yet: all are built then)."""
    suite = os.environ.get('TORCHINDUCTOR_CACHE_DIR', '')
    copied = 0
    if not osp.isdir(suite) or osp.abspath(suite) == osp.abspath(cache):
        return copied
    for root, _, names in os.walk(suite):
        for name in names:
            source = osp.join(root, name)
            binary = source[:-len('.cpp')] + '.so'
            if not name.endswith('.cpp') or not osp.isfile(binary) or \
                    not complete_elf(binary):
                continue
            with open(source, errors='replace') as f:
                if '_chk_kernel' not in f.read():
                    continue
            target = osp.join(cache, osp.relpath(root, suite))
            os.makedirs(target, exist_ok=True)
            for path in (source, binary):
                shutil.copy2(path, target)
            copied += 1
    return copied


def _binaries(cache):
    return sorted(
        osp.join(root, name) for root, _, names in os.walk(cache)
        for name in names if name.endswith('.so'))


@needs_torch(
    '2.8',
    'the same result from a recompile (2.1 and 2.4: 21.46353 vs 21.46354)')
def test_a_zero_byte_so_from_a_killed_compile_is_removed(tmp_path):
    cache = str(tmp_path / 'inductor')
    _seed_cpu_probes(cache)
    first = _compile(cache)
    assert first.returncode == 0, first.stderr
    binaries = _binaries(cache)
    assert binaries and all(complete_elf(p) for p in binaries)
    assert incomplete_binaries(cache) == []
    # the kernel's library (the others: inductor's probes of the CPU's
    # vector instructions), as a compiler killed while writing leaves it
    kernel = max(binaries, key=osp.getsize)
    open(kernel, 'w').close()
    poisoned = _compile(cache)
    assert poisoned.returncode != 0
    assert f'{kernel}: file too short' in poisoned.stderr
    assert incomplete_binaries(cache) == [kernel]
    session = open_cache(cache)  # alone, no unfinished session
    assert session.cleaned == 'removed 1 incomplete binary'
    close_cache(session, finished=True)
    again = _compile(cache)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split() == first.stdout.split()
    assert first.stdout.split() == ['result', '21.46353530883789']
    assert complete_elf(kernel) and incomplete_binaries(cache) == []


def _plant(cache, name='fxgraph/entry'):
    path = osp.join(cache, name)
    os.makedirs(osp.dirname(path), exist_ok=True)
    open(path, 'w').close()
    return path


def test_an_unfinished_session_empties_the_cache_for_the_next(tmp_path):
    cache = str(tmp_path)
    killed = open_cache(cache)
    entry = _plant(cache)
    killed.lock.close()  # the process died: its marker stays
    assert os.listdir(osp.join(cache,
                               MARKERS)) == [osp.basename(killed.marker)]
    session = open_cache(cache)
    assert session.cleaned.startswith('wiped: 1 earlier')
    assert not osp.exists(entry)
    assert os.listdir(osp.join(cache,
                               MARKERS)) == [osp.basename(session.marker)]
    entry = _plant(cache)
    close_cache(session, finished=True)
    assert os.listdir(osp.join(cache, MARKERS)) == []
    session = open_cache(cache)  # a finished session: the cache is kept
    assert session.cleaned == 'kept' and osp.exists(entry)
    close_cache(session, finished=False)  # interrupted (Ctrl-C)
    session = open_cache(cache)
    assert session.cleaned.startswith('wiped') and not osp.exists(entry)
    close_cache(session, finished=True)


def test_a_live_session_keeps_its_cache(tmp_path):
    """A session starting beside a live one (its own open of the lock
    file: flock conflicts as between processes) removes nothing; the next
    session alone cleans up what the dead one left."""
    cache = str(tmp_path)
    dead = open_cache(cache)
    dead.lock.close()
    live = open_cache(cache)  # alone: wipes after the dead one
    assert live.cleaned.startswith('wiped')
    dead = open_cache(cache)  # beside the live one
    assert dead.cleaned == 'shared with a live session'
    dead.lock.close()  # dies
    half = _plant(cache, 'ab/cabc.so')  # a compile in progress
    beside = open_cache(cache)
    assert beside.cleaned == 'shared with a live session'
    assert osp.exists(half)
    close_cache(beside, finished=True)
    close_cache(live, finished=True)
    after = open_cache(cache)
    assert after.cleaned.startswith('wiped: 1 earlier')
    assert not osp.exists(half)
    close_cache(after, finished=True)


def test_truncated_binaries_are_incomplete(tmp_path):
    """A real shared library, cut anywhere, is not a complete ELF file;
    whole, it is."""
    # a library a compiler wrote as is (torch's CUDA builds' libraries are
    # patched after linking: bytes past every header, which a cut of one
    # byte leaves alone)
    import _ctypes
    library = _ctypes.__file__
    data = open(library, 'rb').read()
    path = str(tmp_path / 'x.so')
    for size in (len(data), len(data) - 1, len(data) // 2, 64, 4, 0):
        with open(path, 'wb') as f:
            f.write(data[:size])
        assert complete_elf(path) == (size == len(data)), size


def test_this_session_compiles_into_the_suites_cache():
    if os.environ[USER_CACHE_FLAG] == '1':
        pytest.skip('TORCHINDUCTOR_CACHE_DIR set by the user')
    # not one that an import set first (DeepSpeed's sets torch's default)
    assert os.environ['TORCHINDUCTOR_CACHE_DIR'] == suite_cache_dir()
    cache_dir = pytest.importorskip(
        'torch._inductor.runtime.cache_dir_utils',
        reason='needs torch._inductor.runtime.cache_dir_utils').cache_dir
    assert cache_dir() == suite_cache_dir()
    markers = os.listdir(osp.join(suite_cache_dir(), MARKERS))
    assert any(m.startswith(f'{os.getpid()}-') for m in markers)
