"""report(): thread safety and bad values failing at the call."""
import threading
from fractions import Fraction

import numpy as np
import pytest
import torch

from mmstats.stats import Collector, report, report0, reporting


@pytest.fixture(autouse=True)
def clean_state():
    reporting.REPORTER._collectors.clear()  # collectors of earlier tests
    reporting.reset()
    yield
    reporting.REPORTER._collectors.clear()
    reporting.reset()


def test_threads_counts_exact():
    collector = Collector(keep_previous=False)
    threads, per_thread = 8, 20000
    start = threading.Barrier(threads)

    def work(k):
        start.wait()
        for i in range(per_thread):
            report('f', float(k))
            report('t', torch.tensor(float(i % 7)))
            if i == per_thread // 2 and k == 0:
                collector.update()  # a flush while the others report
                first.append((collector.num('f'), collector.num('t')))

    first = []
    pool = [threading.Thread(target=work, args=(k, )) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    collector.update()
    total_f = first[0][0] + collector.num('f')
    total_t = first[0][1] + collector.num('t')
    assert total_f == threads * per_thread
    assert total_t == threads * per_thread
    # the values of the second update: every thread's remaining values
    assert collector.max('t') == 6 and collector.min('t') == 0


def test_thread_values_flushed_after_thread_ends():
    collector = Collector(keep_previous=False)
    t = threading.Thread(target=lambda: report('x', [1.0, 2.0, 3.0]))
    t.start()
    t.join()
    collector.update()
    assert collector.num('x') == 3 and collector.mean('x') == 2.0
    collector.update()
    assert collector.num('x') == 0  # taken once


@pytest.mark.parametrize('value,error', [
    (10**400, ValueError),
    (-10**400, ValueError),
    ([1.0, 10**400], ValueError),
    (Fraction(10**400, 3), ValueError),
    ('1.5', TypeError),
    (b'1', TypeError),
    (None, TypeError),
    ([1.0, None], TypeError),
    (['1.5', '2'], TypeError),
    ([[1.0], [2.0, 3.0]], TypeError),
    (np.array([1.0, None], dtype=object), TypeError),
    (np.array(['a']), TypeError),
    ({
        'a': 1.0
    }, TypeError),
    (object(), TypeError),
    (torch.tensor([1.0, 0.0]).to_sparse(), TypeError),
    (torch.empty(3, device='meta'), TypeError),
    (torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8), TypeError),
    (torch.ones(2, dtype=torch.complex64), TypeError),
    ([torch.ones(2), torch.ones(2).to_sparse()], TypeError),
])
def test_bad_values_fail_at_the_call(value, error):
    collector = Collector(keep_previous=False)
    report('good', 1.0)
    with pytest.raises(error, match="report\\('bad/name'\\)"):
        report('bad/name', value)
    collector.update()  # update() is unaffected, nothing else is lost
    assert collector.names() == ['good'] and collector.num('good') == 1


@pytest.mark.parametrize('name', [5, None, b'x', ('a', )])
def test_non_str_names_fail(name):
    collector = Collector()  # noqa: F841 (alive while reporting)
    with pytest.raises(TypeError, match='name must be a str'):
        report(name, 1.0)
    with pytest.raises(TypeError, match='name must be a str'):
        report0(name, 1.0)


def test_bad_values_pass_without_collector():
    assert report(5, 10**400) == 10**400  # no collector: no checks, no cost


def test_good_edge_values():
    collector = Collector(keep_previous=False)
    big = 2**80  # beyond int64, exact in float64
    report('i', big)
    report('i', [True, 3, 2.5])
    report('i', np.array([1, 2], dtype=np.uint64))
    report('i', [np.float32(1.5), np.int64(4)])
    report('i', Fraction(1, 2))
    collector.update()
    ref = np.array([big, 1, 3, 2.5, 1, 2, 1.5, 4, 0.5], dtype=np.float64)
    assert collector.num('i') == ref.size
    assert collector.mean('i') == pytest.approx(ref.mean(), rel=1e-12)
    assert collector.max('i') == float(big)


def test_report0_from_thread_on_other_rank(monkeypatch):
    collector = Collector(keep_previous=False)
    monkeypatch.setattr(reporting, 'get_rank', lambda: 1)
    registered = []

    def work():
        for _ in range(3):
            report0('r0', 1.0)  # registers the name only
            collector.update()  # leaves this thread's store empty
        registered.append(len(reporting.REPORTER.store._others))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert registered == [1]  # one store per thread, not one per call
    collector.update()
    assert collector.names() == ['r0'] and collector.num('r0') == 0


class _LockedDict(dict):
    """A dict that fails when it is read or changed without ``lock`` held
    (a thread could be flushing the same store meanwhile)."""

    def __init__(self, lock, *args) -> None:
        super().__init__(*args)
        self.lock = lock

    def _check(self) -> None:
        assert self.lock.locked(), 'a pending store used without its lock'

    def get(self, *args):
        self._check()
        return super().get(*args)

    def __setitem__(self, key, value) -> None:
        self._check()
        super().__setitem__(key, value)

    def setdefault(self, *args):
        self._check()
        return super().setdefault(*args)


def test_report_touches_a_store_only_under_its_lock(monkeypatch):
    """Deterministic check of what a race would break: every path of
    report() reads and changes the pending store only while holding its
    lock (flush() takes the same lock from another thread)."""
    from mmstats.stats.reporting import REPORTER
    collector = Collector()
    store = REPORTER.store
    for attr in ('numbers', 'tensors', 'rows'):
        monkeypatch.setattr(store, attr, _LockedDict(store.lock))
    report('float', 1.0)
    report('float', 2.0)
    report('tensor', torch.ones(3))
    report('large', torch.ones(5000))
    report('list', [1, 2, 3])
    collector.update()
    assert collector.num('float') == 2 and collector.num('large') == 5000
