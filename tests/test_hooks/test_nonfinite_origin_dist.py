"""Where a NaN started, on 2 gloo ranks (the pieces and the 1-process cases
are in ``test_nonfinite_origin.py``): the same FloatingPointError text on
every rank, naming only the ranks that saw each finding, recomputed from
every rank's raw values."""
import os.path as osp

import pytest

from tests.helpers.dist import run_distributed
from tests.test_hooks.test_nonfinite_origin import (HOST, PLANTED, expected,
                                                    train)


def _worker(rank, world_size, work_dir, compile, watch=True, iteration=5):
    return train(
        osp.join(work_dir, str(rank)),
        watch,
        iteration,
        rank=1,
        dist=True,
        compile=compile)


@pytest.mark.parametrize(
    'compile, iteration', [(False, 4), (True, 5)], ids=['eager', 'dynamo'])
def test_two_ranks_raise_the_same_text(tmp_path, compile, iteration):
    """Planted on rank 1 at ``iteration``: its forward origin is rank 1's;
    DDP spreads the NaN gradients to rank 0; both ranks raise the same
    FloatingPointError together: at the end of the next iteration (the
    flags of the watched iteration agreed by an all_reduce one iteration
    later), which for 5 is the publication after 6 anyway."""
    ranks = run_distributed(_worker, 2, str(tmp_path), compile, True,
                            iteration)
    assert ranks[0]['raised'] is not None
    assert ranks[0]['raised'] == ranks[1]['raised']
    raised = ranks[0]['raised']
    for part in expected(ranks, (4, 5, 6)):
        assert part in raised, (part, raised)
    assert (f'non-finite values at iteration {iteration + 1} (iterations '
            f'4-{iteration + 1} since the previous publication') in raised
    assert (f"output: '{PLANTED}' at iteration {iteration} on rank 1 "
            f'({HOST})') in raised
    assert f"(backward): 'head' at iteration {iteration} on ranks 0" in raised


def test_two_ranks_name_only_the_rank_that_saw_it(tmp_path):
    """Planted on rank 1 at the instrumented iteration 6, not watched:
    only rank 1's loss and outputs are NaN (rank 0's forward ran on finite
    weights); the text names rank 1 alone for them."""
    ranks = run_distributed(_worker, 2, str(tmp_path), False, False, 6)
    assert ranks[0]['raised'] == ranks[1]['raised']
    raised = ranks[0]['raised']
    for part in expected(ranks, (6, )):
        assert part in raised, (part, raised)
    assert f'loss (1 NaN/inf) on rank 1 ({HOST});' in raised
    assert f"output: '{PLANTED}' at iteration 6 on rank 1 ({HOST})" in raised
