"""ThroughputHook's figures from plain numbers, without a Runner: one rank's
interval (samples, iterations, seconds, memory readings, the counted
FLOPs, the peak FLOP/s), its reduction over ranks and every published
figure recomputed by hand, with the interval it covers."""
import math

import pytest

from mmstats.throughput import (Figures, ThroughputInterval, combine_rows,
                                interval_flops, reduce_interval)

NAN = math.nan


def reduce_ranks(shares):
    """:func:`reduce_interval` over the ``(maxima, sums)`` of several ranks
    without processes: each rank's row as it gathers them."""
    rows = [[
        NAN if v is None else float(v) for v in (*m.values(), *s.values())
    ] for m, s in shares]
    maxima, sums = shares[0]
    return combine_rows(list(maxima), list(sums), rows)


def interval(rows, seconds, peak_flops=None, kept=None):
    counts = ThroughputInterval(peak_flops)
    for r in rows:
        counts.add_batch(r, dict)
    counts.add_seconds(seconds)
    if kept is not None:
        counts.keep_peaks(kept)
    return counts


# -------------------------------------------------------- interval_flops
def test_interval_flops_per_sample_where_the_rows_are_known():
    # counted on a batch of 8: 100 per sample; batches 8, 8, 5
    assert interval_flops(800, 8, 21, 3) == 2100.0
    assert interval_flops(800, 8, 0, 0) == 0.0


@pytest.mark.parametrize('counted_rows, samples', [(None, 21), (0, 21),
                                                   (8, None)])
def test_interval_flops_per_iteration_where_rows_are_not_known(
        counted_rows, samples):
    flops = interval_flops(800, counted_rows, samples, 3)
    assert flops == 2400.0 and isinstance(flops, float)


def test_interval_flops_none_without_a_count():
    assert interval_flops(None, 8, 21, 3) is None


# ------------------------------------------------------- one rank's counts
def test_counts_of_an_uneven_last_batch():
    counts = interval([8, 8, 5], 1.5)
    counts.add_seconds(0.25)
    assert (counts.iters, counts.rows, counts.samples) == (3, 21, 21)
    assert counts.seconds == 1.75
    assert counts.unknown is None


def test_a_batch_without_rows_makes_the_samples_unknown():
    counts = interval([8, None, 5], 1.0)
    assert counts.iters == 3
    assert counts.samples is None
    assert counts.unknown == 'dict'


def test_clear_starts_a_new_interval():
    counts = interval([8, None], 2.0, peak_flops=5.0, kept=dict(max_rss=9.0))
    counts.clear()
    assert (counts.iters, counts.rows, counts.samples, counts.seconds,
            counts.unknown, counts.peaks) == (0, 0, 0, 0.0, None, {})
    assert counts.peak_flops == 5.0  # the run's, not the interval's


def test_kept_peaks_are_the_max_of_the_readings():
    counts = ThroughputInterval()
    counts.keep_peaks(dict(max_allocated=30.0, max_reserved=None))
    counts.keep_peaks(dict(max_allocated=20.0, max_reserved=50.0))
    assert counts.peaks == dict(max_allocated=30.0, max_reserved=50.0)


@pytest.mark.parametrize(
    'kept, read, local',
    [
        (30.0, 20.0, 30.0),  # the peak before validation is the interval's
        (10.0, 20.0, 20.0),  # a higher one read since
        (30.0, None, None),  # not read now: not known
    ])
def test_local_memory_is_the_higher_of_kept_and_read(kept, read, local):
    counts = interval([4], 1.0, kept=dict(max_allocated=kept))
    maxima, _ = counts.local_figures(dict(max_allocated=read))
    assert maxima == {'memory/max_allocated': local, 'throughput/time': 1.0}


def test_local_sums_and_the_peak_that_wins():
    counts = interval([8, 8, 5], 3.0)
    _, sums = counts.local_figures({}, 800, 8, device_peak=7.0)
    assert sums == {
        'throughput/samples': 21.0,
        'throughput/flops': 2100.0,
        'peak': 7.0
    }
    counts.peak_flops = 11.0  # the user's peak_flops wins
    assert counts.local_figures({}, 800, 8, 7.0)[1]['peak'] == 11.0
    # nothing counted: no FLOPs, and no peak to sum
    assert counts.local_figures({}, None, None, 7.0)[1] == {
        'throughput/samples': 21.0,
        'throughput/flops': None,
        'peak': 0.0
    }


# ------------------------------------------------------- the figures
def test_one_rank_every_figure_by_hand():
    counts = interval([8, 8, 5], 3.0, peak_flops=1000.0)
    shares = counts.local_figures(dict(max_rss=600.0), 800, 8)
    figures = counts.figures(*reduce_interval(*shares))
    assert figures == Figures(
        {
            'memory/max_rss': 600.0,
            'memory/max_rss_rank': 0,
            'throughput/iters': 3,
            'throughput/time': 3.0,
            'throughput/iters_per_s': 3 / 3.0,
            'throughput/samples': 21.0,
            'throughput/samples_per_s': 21 / 3.0,
            'throughput/flops': 21 * 100.0,
            'throughput/flops_per_s': 21 * 100.0 / 3.0,
            'throughput/mfu': 21 * 100.0 / 3.0 / 1000.0,
        }, ())
    assert list(figures.scalars) == [  # the order they are written in
        'memory/max_rss', 'memory/max_rss_rank', 'throughput/iters',
        'throughput/time', 'throughput/iters_per_s', 'throughput/samples',
        'throughput/samples_per_s', 'throughput/flops',
        'throughput/flops_per_s', 'throughput/mfu'
    ]


def test_two_ranks_sums_maxima_and_mfu_over_both_peaks():
    """Rank 0: batches 16, 16, 8 in 4 s, counted 1600 FLOPs on 16 rows;
    rank 1: 16, 16, 4 in 6 s, counted 1600 on 16; peaks 10 and 30 FLOP/s
    (different devices); memory 700 and 900 MiB."""
    ranks = [interval([16, 16, 8], 4.0), interval([16, 16, 4], 6.0)]
    shares = [
        ranks[0].local_figures(dict(max_allocated=700.0), 1600, 16, 10.0),
        ranks[1].local_figures(dict(max_allocated=900.0), 1600, 16, 30.0)
    ]
    maxima, sums = reduce_ranks(shares)
    samples = 40 + 36
    flops = 1600 / 16 * 40 + 1600 / 16 * 36
    seconds = 6.0  # the slowest rank's
    for counts in ranks:  # both ranks publish the same
        scalars = counts.figures(maxima, sums).scalars
        assert scalars['memory/max_allocated'] == 900.0
        assert scalars['memory/max_allocated_rank'] == 1
        assert scalars['throughput/iters'] == 3  # every rank's iterations
        assert scalars['throughput/time'] == seconds
        assert scalars['throughput/iters_per_s'] == pytest.approx(3 / 6.0)
        assert scalars['throughput/samples'] == samples
        assert scalars['throughput/samples_per_s'] == pytest.approx(samples /
                                                                    seconds)
        assert scalars['throughput/flops'] == flops
        assert scalars['throughput/flops_per_s'] == pytest.approx(flops /
                                                                  seconds)
        assert scalars['throughput/mfu'] == pytest.approx(flops / seconds /
                                                          (10.0 + 30.0))


def test_two_ranks_with_the_same_peak_flops_take_both_devices():
    ranks = [interval([4], 2.0, peak_flops=100.0) for _ in range(2)]
    maxima, sums = reduce_ranks([r.local_figures({}, 40, 4) for r in ranks])
    scalars = ranks[0].figures(maxima, sums).scalars
    assert scalars['throughput/flops_per_s'] == 80 / 2.0
    assert scalars['throughput/mfu'] == pytest.approx(80 / 2.0 / 200.0)


def test_an_unknown_batch_on_one_rank_takes_its_flops_per_iteration():
    ranks = [interval([8, 5], 1.0), interval([8, None], 1.0)]
    shares = [r.local_figures({}, 800, 8, 1.0) for r in ranks]
    figures = ranks[1].figures(*reduce_ranks(shares))
    assert 'throughput/samples' not in figures.scalars
    assert 'throughput/samples_per_s' not in figures.scalars
    assert figures.scalars['throughput/flops'] == 100 * 13 + 800 * 2
    assert figures.missing == ('throughput/samples', )


def test_no_flops_counted_publishes_no_flops_and_misses_nothing():
    counts = interval([8, 8], 2.0, peak_flops=1e9)
    figures = counts.figures(*reduce_interval(*counts.local_figures({})))
    assert figures.scalars == {
        'throughput/iters': 2,
        'throughput/time': 2.0,
        'throughput/iters_per_s': 1.0,
        'throughput/samples': 16.0,
        'throughput/samples_per_s': 8.0
    }
    assert figures.missing == ()


def test_no_peak_known_publishes_flops_without_mfu():
    counts = interval([8], 2.0)  # peak_flops None
    figures = counts.figures(*reduce_interval(
        *counts.local_figures({}, 800, 8, device_peak=None)))
    assert figures.scalars['throughput/flops_per_s'] == 400.0
    assert 'throughput/mfu' not in figures.scalars
    assert figures.missing == ('throughput/mfu', )
    # one rank of two without a known peak: none
    ranks = [interval([8], 2.0), interval([8], 2.0)]
    shares = [
        ranks[0].local_figures({}, 800, 8, 5.0),
        ranks[1].local_figures({}, 800, 8, None)
    ]
    figures = ranks[0].figures(*reduce_ranks(shares))
    assert 'throughput/mfu' not in figures.scalars
    assert figures.missing == ('throughput/mfu', )


def test_memory_unread_on_one_rank_is_missing():
    ranks = [interval([8], 1.0), interval([8], 1.0)]
    shares = [
        ranks[0].local_figures(dict(max_rss=5.0)),
        ranks[1].local_figures(dict(max_rss=None))
    ]
    figures = ranks[0].figures(*reduce_ranks(shares))
    assert not any(k.startswith('memory/') for k in figures.scalars)
    assert figures.missing == ('memory/max_rss', )


def test_a_zero_time_publishes_no_rate():
    counts = interval([8, 8], 0.0, peak_flops=1.0)
    figures = counts.figures(*reduce_interval(
        *counts.local_figures({}, 800, 8)))
    assert figures.scalars == {
        'throughput/iters': 2,
        'throughput/time': 0.0,
        'throughput/samples': 16.0,
        'throughput/flops': 1600.0
    }
    assert figures.missing == ()


def test_each_interval_covers_its_own_iterations():
    counts = ThroughputInterval()
    published = []
    for rows, seconds in (([8, 8, 8], 3.0), ([8, 5], 4.0)):
        for r in rows:
            counts.add_batch(r)
        counts.add_seconds(seconds)
        shares = counts.local_figures({}, 80, 8, None)
        published.append(counts.figures(*reduce_interval(*shares)).scalars)
        counts.clear()
    assert [(p['throughput/iters'], p['throughput/time'],
             p['throughput/samples'], p['throughput/flops'])
            for p in published] == [(3, 3.0, 24.0, 240.0),
                                    (2, 4.0, 13.0, 130.0)]


# ----------------------------------------------------- the reduction's rows
def test_combine_rows_ties_go_to_the_lowest_rank_and_nan_is_none():
    maxima, sums = combine_rows(['a', 'b'], ['s', 't'],
                                [[3.0, 1.0, 1.0, NAN], [3.0, 2.0, 2.5, 4.0],
                                 [1.0, 2.0, 0.5, 4.0]])
    assert maxima == {'a': (3.0, 0), 'b': (2.0, 1)}
    assert sums == {'s': 4.0, 't': None}
