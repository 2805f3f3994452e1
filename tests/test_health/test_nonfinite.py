"""NonfiniteWatch on its own: the first non-finite iteration of each module,
in forward and backward order, whatever the batching of its checks
(``FOLD_EVERY``), against the same answer computed from the planted
values in plain Python."""
import math
import random
from unittest.mock import patch

import pytest
import torch

import mmstats.health.nonfinite as nonfinite
from mmstats.health.nonfinite import NonfiniteWatch

NAMES = ['a', 'b', 'c', 'd']


def run(plants, iterations=150):
    """``plants``: {(iteration, kind, module)}: NaN there. Modules run in
    the order c, a, d, b (b twice); gradients come per module (armed
    steps, even iterations) or per tensor (two per module; as a tensor or
    as a list of 0-d tensors)."""
    watch = NonfiniteWatch(NAMES, torch.device('cpu'))
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])
    modules = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    for it in range(1, iterations + 1):
        watch.begin_iteration(it)
        for index in (2, 0, 3, 1, 1):
            out = torch.ones(5)
            if (it, 'forward', index) in plants:
                out[3] = math.nan
            watch.forward(index, out)
        grads = torch.ones(8)
        for (at, kind, index) in plants:
            if at == it and kind == 'backward':
                grads[2 * index + 1] = math.inf
        if it % 4 == 1:  # as torch._foreach_norm gives them
            watch.backward_parts(list(grads.unbind()), rows, modules)
        elif it % 2:
            watch.backward_parts(grads, rows, modules)
        else:
            watch.backward(grads.view(4, 2).sum(1))
        watch.end_iteration()
    return watch.take()


def reference(plants):
    order = [2, 0, 3, 1]  # forward order
    out = {}
    for kind, pick in (('forward', 0), ('backward', -1)):
        found = sorted(
            (at, order.index(i)) for at, k, i in plants if k == kind)
        if not found:
            out[kind] = None
            continue
        first = found[0][0]
        positions = [p for at, p in found if at == first]
        pos = min(positions) if pick == 0 else max(positions)
        out[kind] = (first, pos, NAMES[order[pos]])
    return out


@pytest.mark.parametrize('fold_every', [1, 3, 64, 1000])
@pytest.mark.parametrize('seed', range(4))
def test_first_stamps_whatever_the_batching(fold_every, seed):
    rng = random.Random(seed)
    plants = {(rng.randint(1,
                           150), rng.choice(['forward',
                                             'backward']), rng.randint(0, 3))
              for _ in range(rng.randint(0, 6))}
    with patch.object(nonfinite, 'FOLD_EVERY', fold_every):
        assert run(plants) == reference(plants)


def test_reset_forgets():
    watch = NonfiniteWatch(NAMES, torch.device('cpu'))
    watch.begin_iteration(3)
    watch.forward(0, torch.tensor([math.nan]))
    watch.end_iteration()
    watch.reset()
    assert watch.take() == dict(forward=None, backward=None)


def test_the_text_stays_short_on_many_ranks():
    from mmstats.health.nonfinite import describe_origins
    origins = [
        dict(rank=r, host=f'h{r // 8}', names={'loss': 1}, modules=[])
        for r in range(64)
    ]
    names = {f'n{i:02d}': 1 for i in range(12)}
    names['loss'] = 64
    text = describe_origins(origins, names, 'iteration 9')
    assert text.startswith(
        'non-finite values at iteration 9: loss (64 NaN/inf) on ranks 0 '
        '(h0), 1 (h0), 2 (h0), 3 (h0), 4 (h0), 5 (h0), 6 (h0), 7 (h0) and '
        '56 more; n00 (1 NaN/inf)')
    assert text.endswith('n03 (1 NaN/inf); and 8 names more')
    assert len(text) < 400 and '\n' not in text  # no module origin


def test_the_origin_comes_first():
    from mmstats.health.nonfinite import describe_origins
    origins = [
        dict(
            rank=0,
            host='a',
            names={
                'modules/head/act': 2,
                'loss': 1
            },
            modules=[
                dict(
                    forward=(5, 2, 'backbone.stages.1'),
                    backward=(5, 0, 'head'),
                    every_iteration=True)
            ])
    ]
    lines = describe_origins(origins, {
        'modules/head/act': 2,
        'loss': 1
    }, 'iteration 8').split('\n')
    assert lines == [
        "first non-finite module output: 'backbone.stages.1' at iteration 5 "
        'on rank 0 (a) (watched every iteration)',
        "first non-finite module gradient (backward): 'head' at iteration 5 "
        'on rank 0 (a) (watched every iteration)',
        'non-finite values at iteration 8: loss (1 NaN/inf) on rank 0 (a); '
        'modules/head/act (2 NaN/inf) on rank 0 (a)'
    ]
