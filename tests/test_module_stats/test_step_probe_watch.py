"""StepProbe's gradient notes for NonfiniteWatch: one norm per gradient
tensor of a watched module, mapped to the right module also when some
parameters have no gradient at a step (the cached layout of the present
gradients), and gradients of unwatched modules left out."""
import math

import torch
from mmengine.optim import OptimWrapper
from torch import nn

from mmstats.health import NonfiniteWatch
from mmstats.module_stats import StepProbe
from mmstats.sharding import ParamLayout

WATCHED = ['0', '1', '2']  # net[3] is not watched


def probe_and_net():
    net = nn.Sequential(*(nn.Linear(2, 2) for _ in range(4)))
    watch = NonfiniteWatch(WATCHED, torch.device('cpu'))
    layout = ParamLayout(net)
    owners = layout.owners([net[int(name)] for name in WATCHED])
    total = len(WATCHED)
    parts = [(tuple(owners.get(i, ())) + (total, ), part)
             for i, part in enumerate(layout.parts)]
    wrapper = OptimWrapper(torch.optim.SGD(net.parameters(), lr=0.0))
    probe = StepProbe(
        wrapper, parts, total + 1, [], torch.device('cpu'), watch=watch)
    return probe, watch, net, wrapper


def step(probe, watch, net, wrapper, iteration, unused=(), nan_in=None):
    """One watched step: modules in ``unused`` get no gradient; the weight
    gradient of ``nan_in`` is NaN."""
    watch.begin_iteration(iteration)
    probe.begin_iteration(armed=False, watching=True)
    for index, module in enumerate(net):
        for p in module.parameters():
            p.grad = None if index in unused else torch.ones_like(p)
    if nan_in is not None:
        net[nan_in].weight.grad[0, 1] = math.nan
    wrapper.step()
    probe.end_iteration()
    watch.end_iteration()


def test_gradients_of_unwatched_modules_are_not_normed():
    probe, watch, net, wrapper = probe_and_net()
    assert len(probe._watch_parts) == 6  # 3 watched modules x 2 tensors
    step(probe, watch, net, wrapper, 1, nan_in=3)  # unwatched: not seen
    assert watch.take()['backward'] is None
    probe.remove()


def test_missing_gradients_map_the_rest_to_their_modules():
    probe, watch, net, wrapper = probe_and_net()
    step(probe, watch, net, wrapper, 1)
    step(probe, watch, net, wrapper, 2, unused=(0, ))  # a layout of its own
    step(probe, watch, net, wrapper, 3, unused=(1, ), nan_in=2)
    step(probe, watch, net, wrapper, 4, unused=(0, ), nan_in=1)
    assert len(probe._watch_index) == 3  # all, without 0, without 1
    # iteration 3: module '2' (position 2 of the names) and nothing else
    assert watch.take()['backward'] == (3, 2, '2')
    step(probe, watch, net, wrapper, 5, unused=(0, 1, 2))  # no gradient
    step(probe, watch, net, wrapper, 6, unused=(0, ), nan_in=1)
    assert watch.take()['backward'] == (6, 1, '1')
    probe.remove()
