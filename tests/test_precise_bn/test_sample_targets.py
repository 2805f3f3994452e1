"""How many batches update_bn_stats reads: exactly enough for
``num_samples`` over all ranks (the per-rank target is rounded up), never a
batch more, and the statistics are those of exactly the batches read."""
import pytest

from mmstats import update_bn_stats
from tests.helpers.dist import run_distributed
from tests.helpers.logs import mmengine_logs, warnings_logged
from .refs import (INPUT_SHAPES, assert_stats, bn_inputs, make_batches,
                   make_model)


@pytest.mark.parametrize('num_samples,batches', [(40, 5), (41, 6), (1, 1)])
def test_stops_at_the_first_batch_that_reaches_num_samples(
        caplog, num_samples, batches):
    model = make_model('bn1d_2d')
    data = make_batches(INPUT_SHAPES['bn1d_2d'], [8] * 8)
    captured = bn_inputs(model, data[:batches])  # exactly the batches read
    with mmengine_logs(caplog):
        summary = update_bn_stats(model, data, num_samples, progress=False)
    assert (summary['num_batches'], summary['num_samples']) == (batches,
                                                                8 * batches)
    assert warnings_logged(caplog) == []  # the loader did not run out
    assert_stats(model, captured, 'population')


def _count_two_ranks(rank, world_size, num_samples):
    model = make_model('bn1d_2d')
    data = make_batches(INPUT_SHAPES['bn1d_2d'], [4] * 10, seed=rank)
    summary = update_bn_stats(model, data, num_samples, progress=False)
    return summary['num_batches'], summary['num_samples']


def test_per_rank_target_is_rounded_up():
    # 41 samples over 2 ranks: 21 per rank, 6 batches of 4 each (24); a
    # floored target (20) would stop after 5 and use 40 < 41 samples
    results = run_distributed(_count_two_ranks, 2, 41)
    assert results == [(12, 48)] * 2
    assert run_distributed(_count_two_ranks, 2, 40) == [(10, 40)] * 2
