"""The name-table protocol without processes: N ranks simulated by threads
that exchange their payloads through a fake ReduceFns."""
import math
import threading

import numpy as np
import pytest

from mmstats.stats.moments import (M2, MAX, MEAN, MIN, NONFINITE, N,
                                   reduce_groups)
from mmstats.stats.protocol import GATHER_MAX_WORLD, NameTable, RankFailure


class FakeRanks:
    """``world`` simulated ranks; collectives sum / max / gather the
    payloads of all ranks in rank order (identical bits for everyone)."""

    def __init__(self, world, gather=True):
        self.world = world
        self.gather = gather  # offer all_gather (small-group algorithm)
        self.barrier = threading.Barrier(world, timeout=20)
        self.slots = [None] * world
        self.calls = [[] for _ in range(world)]

    def _exchange(self, rank, kind, payload):
        self.calls[rank].append((kind, np.size(payload)))
        self.slots[rank] = payload
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def fns(self, rank):
        ranks = self

        class Fns:
            world_size = ranks.world

            def __init__(self):
                self.rank = rank

            def all_reduce_sum(self, x):
                return np.sum(ranks._exchange(rank, 'sum', x.copy()), 0)

            def all_reduce_max(self, x):
                return np.max(ranks._exchange(rank, 'max', x.copy()), 0)

            def all_gather_object(self, obj):
                return ranks._exchange(rank, 'gather', obj)

        class GatherFns(Fns):

            def all_gather(self, x):
                return np.stack(ranks._exchange(rank, 'all_gather', x.copy()))

        return GatherFns() if self.gather else Fns()

    def run(self, fn):
        """``fn(rank, fns)`` on every simulated rank; their results."""
        results, errors = [None] * self.world, [None] * self.world

        def target(rank):
            try:
                results[rank] = fn(rank, self.fns(rank))
            except BaseException as e:  # noqa: B902 - re-raised below
                errors[rank] = e

        threads = [
            threading.Thread(target=target, args=(r, ))
            for r in range(self.world)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), 'hang'
        return results, errors


def rows_of(groups):
    """``{name: values}`` -> sorted names and their local rows."""
    names = sorted(groups)
    if not names:
        return [], np.zeros((0, 6))
    values = np.concatenate([np.asarray(groups[n], float) for n in names])
    seg = np.repeat(np.arange(len(names)), [len(groups[n]) for n in names])
    return names, reduce_groups(values, seg, len(names))


def assert_row(row, values, rel=1e-9):
    x = np.asarray(values, float)
    fin = x[np.isfinite(x)]
    assert row[N] == fin.size and row[NONFINITE] == x.size - fin.size
    assert math.isclose(row[MEAN], fin.mean(), rel_tol=rel)
    std = math.sqrt(row[M2] / row[N])
    assert math.isclose(std, fin.std(), rel_tol=rel), (std, fin.std())
    assert row[MIN] == fin.min() and row[MAX] == fin.max()


def sync_all(ranks, tables, per_rank):

    def fn(rank, fns):
        return tables[rank].sync(*rows_of(per_rank[rank]), fns)

    results, errors = ranks.run(fn)
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.mark.parametrize('world', [2, 5, 8, 9])
@pytest.mark.parametrize('loc', [0., 1e6, 1e12])
@pytest.mark.parametrize('gather', [True, False])
def test_exact_and_identical_on_every_rank(world, loc, gather):
    rng = np.random.default_rng(world)
    # uneven sizes; one rank has no 'x'; NaN and inf on some ranks
    per_rank = [{
        'x': rng.normal(loc, 1., size=3 + 7 * r)
    } if r != 1 else {} for r in range(world)]
    per_rank[0]['y'] = [math.nan, 2.5, math.inf]
    per_rank[-1]['y'] = [-1.0]
    ranks = FakeRanks(world, gather)
    tables = [NameTable(10, 100) for _ in range(world)]
    results = sync_all(ranks, tables, per_rank)
    names, rows = results[0]
    assert names == ['x', 'y']
    for other_names, other_rows in results[1:]:
        assert other_names == names
        assert other_rows.tobytes() == rows.tobytes()  # bit-identical
    union_x = np.concatenate([g['x'] for g in per_rank if 'x' in g])
    # at 1e12 each value carries only ~1e-4 absolute precision: the std of
    # ~1 is exact to what float64 can hold per rank, not to 1e-9
    assert_row(rows[0], union_x, rel=1e-9 if loc < 1e9 else 1e-4)
    assert math.isclose(
        rows[0][MEAN], union_x.mean(), rel_tol=1e-14, abs_tol=1e-12)
    assert_row(rows[1], [math.nan, 2.5, math.inf, -1.0])
    ranks.calls = [[] for _ in range(world)]
    steady = sync_all(ranks, tables, per_rank)
    assert steady[0][1].tobytes() == rows.tobytes()
    assert GATHER_MAX_WORLD == 4
    if gather and world <= 4:
        # small groups, steady state: ONE all_gather of header and rows
        assert ranks.calls[0] == [('all_gather', 2 + 6 * 2)]
    else:  # 3 collectives whose sizes do not depend on the world
        assert ranks.calls[0] == [('max', 2 + 2 * 2), ('sum', 3 * 2),
                                  ('sum', 2 * 2)]


@pytest.mark.parametrize('world', [2, 3])
def test_gather_and_reduce_agree(world):
    """Both algorithms publish the same statistics (to rounding)."""
    rng = np.random.default_rng(7)
    per_rank = [{
        'a': rng.normal(5., 2., 4 + r).tolist(),
        'b': [math.inf, float(r)]
    } for r in range(world)]
    out = {}
    for gather in (True, False):
        tables = [NameTable(10, 100) for _ in range(world)]
        out[gather] = sync_all(FakeRanks(world, gather), tables, per_rank)[0]
    assert out[True][0] == out[False][0] == ['a', 'b']
    np.testing.assert_allclose(out[True][1], out[False][1], rtol=1e-13)


def test_new_names_agree_and_bound_is_deterministic():
    ranks = FakeRanks(3)
    tables = [NameTable(4, 100) for _ in range(3)]
    per_rank = [{'b': [1.], 'e': [2.]}, {'a': [3.], 'd': [4.]}, {'c': [5.]}]
    with pytest.warns(
            UserWarning,
            match=r"1 new names refused .*full "
            r"\(max_names=4\): 'e'\."):
        results = sync_all(ranks, tables, per_rank)
    for names, rows in results:
        assert names == ['a', 'b', 'c', 'd']  # sorted union, first 4
        assert rows[:, N].tolist() == [1., 1., 1., 1.]
        assert rows[:, MEAN].tolist() == [3., 1., 5., 4.]
    # the refused name is asked again: still no room, refused again
    with pytest.warns(UserWarning, match="'e'"):
        sync_all(ranks, tables, [{'e': [1.]}, {}, {}])
    assert all(t.names == ['a', 'b', 'c', 'd'] for t in tables)


def test_idle_names_are_evicted_then_room_frees_up():
    ranks = FakeRanks(2)
    tables = [NameTable(2, 3) for _ in range(2)]
    sync_all(ranks, tables, [{'a': [1.]}, {'b': [2.]}])
    for step in range(3):  # 'b' gets no value for 3 updates
        names, rows = sync_all(ranks, tables, [{'a': [1.]}, {}])[1]
        assert names == (['a', 'b'] if step < 2 else ['a'])
    names, rows = sync_all(ranks, tables, [{}, {'c': [7.]}])[0]
    assert names == ['a', 'c'] and rows[1, MEAN] == 7.
    # a value on ANY rank keeps a name: only rank 1 reports 'c'
    for _ in range(5):
        names, _ = sync_all(ranks, tables, [{}, {'c': [7.]}])[0]
    assert names == ['c']


def test_failure_on_one_rank_raises_on_every_rank():
    ranks = FakeRanks(4)
    tables = [NameTable(10, 100) for _ in range(4)]
    sync_all(ranks, tables, [{'a': [1.]}] * 4)

    def fn(rank, fns):
        return tables[rank].sync(
            *rows_of({'new': [1.]}), fns, failed=rank == 2)

    results, errors = ranks.run(fn)
    for e in errors:
        assert isinstance(e, RankFailure) and 'on rank 2' in str(e)
    assert all(t.names == ['a'] for t in tables)  # table untouched


@pytest.mark.parametrize('world, gather', [(2, True), (4, True), (4, False),
                                           (GATHER_MAX_WORLD + 1, True)])
def test_a_failure_on_rank_0_raises_on_every_rank(world, gather):
    """Rank 0 failing must not read as "no failure" (a header of ``rank``
    instead of ``rank + 1`` would be 0 there): on the gathered and on the
    reduced protocol, every rank raises naming rank 0 and no table moves."""
    ranks = FakeRanks(world, gather=gather)
    tables = [NameTable(10, 100) for _ in range(world)]
    sync_all(ranks, tables, [{'a': [1.]}] * world)

    def fn(rank, fns):
        return tables[rank].sync(
            *rows_of({'new': [1.]}), fns, failed=rank == 0)

    results, errors = ranks.run(fn)
    for e in errors:
        assert isinstance(e, RankFailure) and 'on rank 0' in str(e), e
    assert all(t.names == ['a'] for t in tables)
