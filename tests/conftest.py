"""Fixtures and markers shared by every test.

Markers (set automatically, see :func:`pytest_collection_modifyitems`):

- ``dist``: the test calls ``run_distributed`` (real gloo ranks);
- ``runner``: the test builds a real mmengine ``Runner``;
- ``slow``: the test starts Python subprocesses or processes
  (``multiprocessing``), calls ``torch.compile`` (seconds of compilation),
  or is marked by hand.

Each is set from the names the test uses, in its own code, in the
module-level helpers of the test tree it calls and in the fixtures of the
test tree it uses (a module fixture that launches marks its tests).

``make test-quick`` runs ``-m "not dist and not runner and not slow"``.
With pytest-xdist's ``--dist loadgroup`` every ``dist`` test goes to the
same worker, so one set of rank pools serves them all.

torch.compile's inductor cache is the suite's own directory
(:mod:`tests.helpers.compile_cache`), set here before anything compiles:
rank processes, subprocesses and xdist workers inherit it. A
``TORCHINDUCTOR_CACHE_DIR`` set by the user is used as it is.

One torch thread (``OMP_NUM_THREADS=1`` unless set), as ``make demo`` and
the gloo ranks use: the suite's models are tiny, and a second intra-op
thread per process only spins on a busy 2-core machine (the demo's 8-epoch
training in a subprocess: 11 s of CPU with one thread, 36 s with two).
Subprocesses and xdist workers inherit it.
"""
import gc
import os
import os.path as osp
import types

import pytest
import torch

from tests.helpers.compile_cache import (USER_CACHE_FLAG, close_cache,
                                         open_cache, suite_cache_dir)

# before anything imports DeepSpeed (tests.helpers.torch_versions does):
# its import sets torch's default cache dir when none is set. Whether the
# user gave one is decided once, in the first process (xdist workers and
# ranks inherit both variables)
INDUCTOR_CACHE = suite_cache_dir()
os.environ.setdefault(USER_CACHE_FLAG,
                      str(int('TORCHINDUCTOR_CACHE_DIR' in os.environ)))
os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', INDUCTOR_CACHE)
# isort: split
from mmstats.stats import reporting  # noqa: E402
from tests.helpers.loader_workers import stop_loader_workers  # noqa: E402
from tests.helpers.runner import clear_mmengine_singletons  # noqa: E402
from tests.helpers.torch_versions import \
    BY_NODE_ID as NEEDS_NEWER_TORCH  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
os.environ.setdefault('OMP_NUM_THREADS', '1')
torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))
_TEST_DIRS = (osp.join(ROOT, 'tests'), osp.join(ROOT, 'projects'))
# marker -> names whose use (in the test or a test helper it calls) sets it
_MARKER_NAMES = {
    'dist': {'run_distributed'},
    'runner': {'Runner'},
    'slow': {'subprocess', 'Process'},  # subprocess.run, mp's Process
}


def pytest_configure(config):
    for name, doc in (
        ('dist', 'runs real gloo ranks (run_distributed)'),
        ('runner', 'builds a real mmengine Runner'),
        ('slow', 'starts Python subprocesses or compiles (torch.compile)'),
        ('checkpoint_matrix', 'the launches of test_checkpoints.py (make '
         'test-checkpoints; not in make test)'),
        ('preemption_matrix', 'the launches of test_preemption.py (make '
         'test-preemption; not in make test nor .ci/run)'),
        ('benchmarks', 'smoke runs of tools/benchmarks (make '
         'test-benchmarks; not in make test)'),
    ):
        config.addinivalue_line('markers', f'{name}: {doc}')
    if os.environ['TORCHINDUCTOR_CACHE_DIR'] == INDUCTOR_CACHE:
        config._inductor_cache = open_cache(INDUCTOR_CACHE)


def pytest_report_header(config):
    session = getattr(config, '_inductor_cache', None)
    cleaned = f' ({session.cleaned})' if session is not None else ''
    return f"inductor cache: {os.environ['TORCHINDUCTOR_CACHE_DIR']}{cleaned}"


def pytest_unconfigure(config):
    """Leave the inductor cache: marked finished unless the session was
    interrupted (a compile may have been cut short)."""
    session = getattr(config, '_inductor_cache', None)
    if session is not None:
        close_cache(
            session, finished=getattr(config, '_inductor_finished', False))


def _names_used(func, seen) -> set:
    """Global names a test function uses, following the module-level
    functions of the test tree it calls (not mmstats' own code)."""
    code = getattr(func, '__code__', None)
    if code is None or code in seen:
        return set()
    seen.add(code)
    names = set()
    stack = [code]
    while stack:
        co = stack.pop()
        names.update(co.co_names)
        stack += [c for c in co.co_consts if isinstance(c, types.CodeType)]
    found = set(names)
    for name in names:
        target = func.__globals__.get(name)
        target_code = getattr(target, '__code__', None)
        if target_code is not None and \
                target_code.co_filename.startswith(_TEST_DIRS):
            found |= _names_used(target, seen)
    return found


def _test_tree_fixtures(item) -> list:
    """The functions of the fixtures ``item`` uses that the test tree
    defines (a module fixture that trains or launches marks its tests)."""
    info = getattr(item, '_fixtureinfo', None)
    if info is None:
        return []
    funcs = []
    for defs in info.name2fixturedefs.values():
        for fixturedef in defs:
            code = getattr(fixturedef.func, '__code__', None)
            if code is not None and code.co_filename.startswith(_TEST_DIRS):
                funcs.append(fixturedef.func)
    return funcs


def pytest_collection_modifyitems(config, items):
    for item in items:
        func = getattr(item, 'function', None)
        if func is None:
            continue
        seen = set()
        names = _names_used(func, seen)
        for fixture in _test_tree_fixtures(item):
            names |= _names_used(fixture, seen)
        for marker, triggers in _MARKER_NAMES.items():
            if names & triggers:
                item.add_marker(marker)
        if {'torch', 'compile'} <= names:  # torch.compile
            item.add_marker('slow')
        if item.get_closest_marker('dist') is not None:
            item.add_marker(pytest.mark.xdist_group('dist'))
        for pattern, mark in NEEDS_NEWER_TORCH:
            if pattern in item.nodeid:
                item.add_marker(mark)
    if getattr(config.option, 'loadgroup', False):  # an xdist worker
        for item in items:
            _name_the_group(item)
        _slow_modules_first(items)


def pytest_collection_finish(session):
    """Freeze what the collection imported (torch, mmengine, DeepSpeed,
    the test modules: millions of objects) out of Python's cyclic garbage
    collector: its full collections then scan only what the tests made
    since (2 s of a 30 s run of single-process tests were collections).
    The gloo ranks do the same (:mod:`tests.helpers.dist`)."""
    gc.collect()
    gc.freeze()


def _slow_modules_first(items) -> None:
    """Under xdist, the modules with a ``slow`` test (subprocesses,
    torch.compile) run first, each kept whole (its module fixtures set up
    once), in their order: loadgroup hands out the groups (largest first),
    then single tests in collection order, so the long ones start early
    and short ones fill the end, and neither worker waits for the other's
    last subprocess training at the end of the session."""
    slow = {
        item.nodeid.split('::')[0]
        for item in items if item.get_closest_marker('slow') is not None
    }
    items.sort(key=lambda item: item.nodeid.split('::')[0] not in slow)


def _name_the_group(item) -> None:
    """Append ``@GROUP`` to the node id of an ``xdist_group`` test, which
    is how ``--dist loadgroup`` sends a group to one worker. pytest-xdist
    3.8 writes ``item._nodeid``, which pytest >= 9.2 no longer reads (the
    id is ``item._id``): without this every group was spread over both
    workers (two pools of ranks, a module fixture run twice)."""
    names = sorted({
        str(m.args[0] if m.args else m.kwargs.get('name', 'default'))
        for m in item.iter_markers('xdist_group')
    })
    if not names or '@' in item.nodeid.rpartition(']')[2]:
        return
    nodeid = f"{item.nodeid}@{'_'.join(names)}"
    if hasattr(item, '_id'):
        from _pytest.nodeid import coerce_node_id
        item._id = coerce_node_id(nodeid)
    else:
        item._nodeid = nodeid


def pytest_sessionfinish(session, exitstatus):
    """No run is green by running nothing: an empty selection (pytest's
    exit code 5, with or without xdist) fails with exit code 1 and says
    why."""
    session.config._inductor_finished = (
        exitstatus != pytest.ExitCode.INTERRUPTED)
    if hasattr(session.config, 'workerinput'):  # an xdist worker
        return
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        reporter = session.config.pluginmanager.get_plugin('terminalreporter')
        if reporter is not None:
            reporter.write_line(
                'ERROR: no test was selected: check the paths, -m and -k '
                'arguments',
                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope='session', autouse=True)
def _rank_pools():
    """Stop ``run_distributed``'s rank pools when the session ends."""
    yield
    from tests.helpers.dist import shutdown_pools
    shutdown_pools()


@pytest.fixture(autouse=True)
def _fresh_reporting():
    """No pending value, phase or suspension leaks between tests (live
    collectors stay: module-level ones such as training_stats' own)."""
    reporting.reset()
    yield
    reporting.reset()


@pytest.fixture(autouse=True)
def _loader_workers_stopped():
    """The DataLoader workers a test started are stopped when it ends, not
    in a later test's garbage collection (5 s per worker there: see
    :mod:`tests.helpers.loader_workers`)."""
    yield
    from tests.helpers.dist import pool_pids
    stop_loader_workers(keep=set(pool_pids().values()))


@pytest.fixture
def clean_mmengine():
    """Drop mmengine's global singletons (MessageHub, Visualizer, scope,
    loggers) around a test that builds a Runner, like RunnerTestCase does:
    also before it, so that its log goes to this test's streams (a logger
    an earlier test left behind writes to that test's captured stdout, and
    its duplicate-warning filter drops a message it has seen)."""
    clear_mmengine_singletons()
    yield
    clear_mmengine_singletons()
