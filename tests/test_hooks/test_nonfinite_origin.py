"""Where a NaN started: a NaN planted in one module's output at a chosen
iteration, through real Runners (eager and compiled; the 2-rank cases are
in ``test_nonfinite_origin_dist.py``). The FloatingPointError of
``on_nonfinite='raise'`` (the same text on every rank) names the ranks and
hosts that saw each name's NaN/inf values and the first module whose output
(forward order) and gradient (backward order) was non-finite, at which
iteration, on which ranks; every part of it is recomputed from the raw
losses, module outputs and gradients recorded beside the run. A healthy
run gathers nothing and reads no flag."""
import math
import socket
from unittest.mock import patch

import numpy as np
import pytest
import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

import mmstats.health.nonfinite as nonfinite
from tests.helpers.module_stats import RawRecorder, module_stats_cfg
from tests.helpers.runner import gloo_launch

PLANTED = 'backbone.layer1.0'
HOST = socket.gethostname()


class PlantNaN(Hook):
    """Make ``module``'s output NaN at ``iteration`` on ``rank``: a forward
    hook put first (every other hook sees the NaN), adding a 0-d tensor
    that holds 0 or NaN (no Python branch: nothing recompiles). Its
    ``after_train_iter`` runs first: it records the loss of the iteration
    whose publication raises."""
    priority = 'HIGHEST'

    def __init__(self, module, iteration, rank):
        self.module, self.iteration, self.rank = module, iteration, rank
        self.poison = torch.zeros(())
        self.losses = {}

    def before_train(self, runner):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        dict(model.named_modules())[self.module].register_forward_hook(
            lambda module, args, output: output + self.poison, prepend=True)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        planted = (
            runner.iter + 1 == self.iteration and get_rank() == self.rank)
        self.poison.fill_(math.nan if planted else 0.)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.losses[runner.iter + 1] = float(outputs['loss'])


def train(work_dir, watch, iteration, rank=0, dist=False, compile=False):
    """Train 6 iterations (publications after 3 and 6) with the NaN planted
    at ``iteration`` on ``rank``; return what was raised and the raw
    values."""
    cfg = module_stats_cfg(work_dir, dict(health=dict(on_nonfinite='raise')),
                           dict(watch_nonfinite=watch))
    if compile:  # True: dynamo alone (the hooks traced); or a backend
        cfg.compile = dict(
            backend=compile if isinstance(compile, str) else 'eager')
    if dist:
        gloo_launch(cfg)
    runner = Runner.from_cfg(cfg)
    recorder, plant = RawRecorder(), PlantNaN(PLANTED, iteration, rank)
    runner.register_hook(recorder)
    runner.register_hook(plant)
    raised = None
    try:
        runner.train()
    except FloatingPointError as e:
        raised = str(e)
    return dict(
        raised=raised,
        losses=plant.losses,
        acts={
            it: [(n, bool(np.isfinite(a).all())) for n, a in calls.items()]
            for it, calls in recorder.acts.items()
        },
        grads={
            it: {
                n: all(np.isfinite(g).all() for g in grads)
                for n, grads in step['grads'].items()
            }
            for it, step in recorder.steps.items()
        })


def expected(ranks, iterations):
    """The message parts recomputed from every rank's raw values over
    ``iterations`` (the watched ones, in the last interval 4-6)."""
    parts = []
    counts = [
        sum(not math.isfinite(r['losses'][it]) for it in range(4, 7)
            if it in r['losses']) for r in ranks
    ]
    seen = [f'{i} ({HOST})' for i, c in enumerate(counts) if c]
    parts.append(f'loss ({sum(counts)} NaN/inf) on rank'
                 f'{"s" if len(seen) > 1 else ""} {", ".join(seen)}')
    for key, pick in (('forward', 0), ('backward', -1)):
        found = []
        for i, r in enumerate(ranks):
            for it in iterations:
                if key == 'forward':  # in the order the forward ran
                    bad = [n for n, ok in r['acts'].get(it, []) if not ok]
                else:  # modules in forward order whose gradient is not
                    order = [n for n, _ in r['acts'][it]]
                    bad = [n for n in order if not r['grads'][it][n]]
                if bad:
                    found.append((it, bad[pick], i))
                    break
        first = min(it for it, _, _ in found)
        modules = {m for it, m, _ in found if it == first}
        assert len(modules) == 1, found
        on = [f'{i} ({HOST})' for it, _, i in found if it == first]
        what = 'output' if key == 'forward' else 'gradient (backward)'
        parts.append(f"first non-finite module {what}: '{modules.pop()}' at "
                     f'iteration {first} on rank'
                     f'{"s" if len(on) > 1 else ""} {", ".join(on)}')
    return parts


@pytest.mark.parametrize(
    'compile', [False, True, 'inductor'], ids=['eager', 'dynamo', 'inductor'])
def test_watch_finds_the_planted_nan(tmp_path, clean_mmengine, compile):
    """Planted at iteration 5 (not instrumented): the watch stamps it
    exactly; the run raises at the publication after iteration 6. Compiled,
    the forward check runs in the kernel of ModuleStatsHook's custom op."""
    if compile:
        torch._dynamo.reset()
    result = train(tmp_path, True, 5, compile=compile)
    raised = result['raised']
    assert raised and 'at iteration 6' in raised
    for part in expected([result], (4, 5, 6)):
        assert part in raised, (part, raised)
    assert f"'{PLANTED}' at iteration 5 on rank 0" in raised
    assert '(watched every iteration)' in raised


def test_watched_it_is_reported_at_the_iteration_after_its_origin(
        tmp_path, clean_mmengine):
    """Planted at iteration 4, the first of an interval (publications
    after 3 and 6): watching every iteration, the run raises at the end
    of iteration 5, not at the publication after 6; every rank's flag of
    iteration 4 came to the host during iteration 5, without a sync."""
    result = train(tmp_path, True, 4)
    raised = result['raised']
    assert raised and sorted(result['losses']) == [1, 2, 3, 4, 5]
    assert ('non-finite values at iteration 5 (iterations 4-5 since the '
            'previous publication') in raised
    for part in expected([result], (4, 5)):
        assert part in raised, (part, raised)
    assert f"'{PLANTED}' at iteration 4 on rank 0" in raised


def test_without_watch_the_instrumented_iteration_says_what_it_saw(
        tmp_path, clean_mmengine):
    """Planted at 5: the weights are NaN after its step, so the
    instrumented iteration 6 sees the first module (the stem) non-finite;
    the text says it was not watched every iteration."""
    result = train(tmp_path, False, 5)
    raised = result['raised']
    for part in expected([result], (6, )):
        assert part in raised, (part, raised)
    assert "output: 'backbone.stem' at iteration 6" in raised
    assert 'seen on an instrumented iteration' in raised


def test_planted_on_the_instrumented_iteration(tmp_path, clean_mmengine):
    result = train(tmp_path, False, 6)
    for part in expected([result], (6, )):
        assert part in result['raised'], (part, result['raised'])
    assert f"output: '{PLANTED}' at iteration 6" in result['raised']


def test_a_healthy_run_gathers_and_reads_nothing(tmp_path, clean_mmengine):
    """Watching every iteration, a run without NaN never gathers, never
    reads the device flags (take) and stamps no iteration."""
    calls = []
    take = nonfinite.NonfiniteWatch.take

    def counted_take(self):
        calls.append('take')
        return take(self)

    with patch.object(nonfinite, 'all_gather_object',
                      lambda *a: calls.append('gather')), patch.object(
                          nonfinite.NonfiniteWatch, 'take', counted_take):
        result = train(tmp_path, True, 0)  # never planted
    assert result['raised'] is None
    assert calls == []


def _graphs(work_dir, watch):
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    train(work_dir, watch, 0, compile=True)  # healthy
    return counters['stats']['unique_graphs'], sum(
        counters['graph_break'].values())


def test_the_watch_adds_no_graph(tmp_path, clean_mmengine):
    """Watching every iteration compiles as many graphs, with as many
    breaks, as not watching (dynamo; the check runs in the custom op's
    kernel)."""
    from tests.helpers.runner import clear_mmengine_singletons
    without = _graphs(tmp_path / 'a', False)
    assert without[0] > 0
    clear_mmengine_singletons()
    assert _graphs(tmp_path / 'b', True) == without
    torch._dynamo.reset()


class UserPlant(PlantNaN):
    """The user's own hook, at VERY_HIGH priority (before mmstats' hooks,
    after mmengine's HIGHEST ones), plants the NaN."""
    priority = 'VERY_HIGH'


@pytest.mark.parametrize('on_nonfinite', ['warn', 'raise'])
def test_the_report_leads_with_the_origin(tmp_path, clean_mmengine, caplog,
                                          on_nonfinite):
    """The first line is the origin (module, iteration, rank, host); what
    else went non-finite follows, bounded."""
    from mmstats.health.nonfinite import MAX_NAMES
    from tests.helpers.logs import mmengine_logs, warnings_logged
    cfg = module_stats_cfg(tmp_path,
                           dict(health=dict(on_nonfinite=on_nonfinite)),
                           dict(watch_nonfinite=True))
    runner = Runner.from_cfg(cfg)
    runner.register_hook(UserPlant(PLANTED, 5, 0))
    raised = None
    with mmengine_logs(caplog):
        try:
            runner.train()
        except FloatingPointError as e:
            raised = str(e)
    if on_nonfinite == 'raise':
        message = raised
    else:
        warned = [w for w in warnings_logged(caplog) if 'non-finite' in w]
        assert raised is None and len(warned) >= 1
        message = warned[0]
    lines = message.split('\n')
    assert lines[0] == (
        f"StatsCollectorHook: first non-finite module output: '{PLANTED}' "
        f'at iteration 5 on rank 0 ({HOST}) (watched every iteration)')
    assert lines[1].startswith('    first non-finite module gradient')
    assert lines[-1].startswith('    non-finite values at iteration 6 '
                                '(iterations 4-6 since the previous '
                                'publication, over all ranks): loss (')
    assert lines[-1].count(' NaN/inf)') <= MAX_NAMES
    assert len(message) < 1200
