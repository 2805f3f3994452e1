"""StatsCollectorHook: build-time checks and the publication logic with a
mocked Runner, checked against the raw values (real Runners:
``test_stats_collector_runner.py``)."""
import math
import re
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch
from mmengine.hooks import LoggerHook
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from mmstats import report
from mmstats.hooks import StatsCollectorHook
from mmstats.registry import HOOKS
from tests.helpers.logs import mmengine_logs, warnings_logged


# --------------------------------------------------------------- build time
@pytest.mark.parametrize('kwargs, match', [
    (dict(interval=0), 'interval must be None'),
    (dict(interval=2.5), 'interval must be None'),
    (dict(by_epoch='no'), 'by_epoch must be a bool'),
    (dict(by_epoch=0), 'by_epoch must be a bool'),
    (dict(by_epoch=1.0), 'by_epoch must be a bool'),
    (dict(stats=('mean', 'median')), 'stats must be a non-empty list'),
    (dict(stats='mean'), 'stats must be a non-empty list'),
    (dict(stats=None), 'stats must be a non-empty list'),
    (dict(log_stats=('max', ), stats=('mean', )), 'must be a subset'),
    (dict(regex='(unclosed'), 'regex .* is not a valid regular'),
    (dict(regex=None), 'regex must be a str'),
    (dict(prefix=''), 'prefix must be a non-empty str'),
    (dict(on_nonfinite='stop'), 'on_nonfinite must be one of'),
    (dict(max_names=0), 'max_names must be a positive int'),
    (dict(stats=('mean', 'p101')), 'or quantiles "pNN"'),
    (dict(stats=('mean', 'p')), 'or quantiles "pNN"'),
    (dict(max_names=2.0), 'max_names must be a positive int'),
])
def test_invalid_arguments_fail_when_the_hook_is_built(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        HOOKS.build(dict(type='StatsCollectorHook', **kwargs))


def test_registered_and_runs_before_the_logger_hook():
    from mmengine.runner.priority import get_priority
    hook = ROOT_HOOKS.build(dict(type='mmstats.StatsCollectorHook'))
    assert isinstance(hook, StatsCollectorHook)
    assert get_priority(hook.priority) < get_priority(LoggerHook.priority)


def test_inline_flags_in_regex():
    hook = StatsCollectorHook(regex='(?i)loss', collect_timing=False)
    report('LOSS', 1.0)
    report('acc', 1.0)
    assert list(hook.collect('train')) == ['LOSS']


# ------------------------------------------------------ mocked-Runner logic
def mock_runner(epoch_len,
                loop=EpochBasedTrainLoop,
                logger_interval=None,
                ignore_last=True):
    runner = MagicMock()
    runner.train_loop = MagicMock(spec=loop)
    runner.train_dataloader = list(range(epoch_len))
    runner.hooks = []
    if logger_interval:
        runner.hooks = [
            LoggerHook(interval=logger_interval, ignore_last=ignore_last)
        ]
    runner.message_hub.log_scalars = {}
    published = []  # (step, every statistic): the hub keys without mode

    def update_scalar(key, value):
        if key.startswith(('train/', 'val/', 'test/')):
            return
        if not published or published[-1][0] != runner.iter + 1:
            published.append((runner.iter + 1, {}))
        published[-1][1][key] = value

    runner.message_hub.update_scalar.side_effect = update_scalar
    return runner, published


def drive(hook, runner, iters, epoch_len):
    values = []
    for it in range(iters):
        runner.iter = it
        report('x', float(it))
        values.append(float(it))
        hook.after_train_iter(runner, it % epoch_len)
    return values


@pytest.mark.parametrize(
    'loop, interval, ignore_last, expected',
    [
        # 2 epochs of 23 iterations, LoggerHook every 10 inner iterations
        (EpochBasedTrainLoop, None, True, [10, 20, 23, 33, 43, 46]),
        (EpochBasedTrainLoop, None, False, [10, 20, 23, 33, 43, 46]),
        (EpochBasedTrainLoop, 5, True, [5, 10, 15, 20, 23, 28, 33, 38, 43, 46
                                        ]),
        # iteration-based: global iterations (and LoggerHook's end_of_epoch)
        (IterBasedTrainLoop, None, True, [10, 20, 30, 40]),
    ])
def test_publications_follow_logger_hook_and_epoch_ends(
        loop, interval, ignore_last, expected):
    hook = StatsCollectorHook(
        interval=interval,
        collect_outputs=False,
        collect_timing=False,
        stats=('mean', 'num'))
    epoch_len = 23 if loop is EpochBasedTrainLoop else 1000
    runner, published = mock_runner(epoch_len, loop, 10, ignore_last)
    hook.before_run(runner)
    values = drive(hook, runner, 46, epoch_len)
    steps = [step for step, _ in published]
    assert steps == expected
    start = 0
    for step, scalars in published:  # each covers exactly its iterations
        window = values[start:step]
        assert scalars['stats/x/num'] == len(window)
        np.testing.assert_allclose(
            scalars['stats/x/mean'], np.mean(window), rtol=1e-12)
        start = step


def test_no_logger_hook_publishes_every_10_iterations():
    hook = StatsCollectorHook(collect_outputs=False, collect_timing=False)
    runner, published = mock_runner(1000, IterBasedTrainLoop)
    hook.before_run(runner)
    drive(hook, runner, 25, 1000)
    assert [step for step, _ in published] == [10, 20]


def test_collect_outputs_reports_train_step_losses():
    hook = StatsCollectorHook(
        interval=2, stats=('mean', 'num'), collect_timing=False)
    runner, published = mock_runner(100, IterBasedTrainLoop)
    hook.before_run(runner)
    for it, loss in enumerate([0.5, 1.5]):
        runner.iter = it
        hook.after_train_iter(
            runner, it, outputs=dict(loss=torch.tensor(loss)))
    expected = {'stats/loss/mean': 1.0, 'stats/loss/num': 2.0}
    assert published == [(2, expected)]


def test_values_reported_during_validation_are_kept_apart():
    hook = StatsCollectorHook(
        interval=1,
        collect_outputs=False,
        collect_timing=False,
        stats=('mean', ))
    runner, published = mock_runner(100, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    runner.iter, runner.epoch = 0, 0
    report('z', 1.0)
    hook.before_val_epoch(runner)
    report('z', 100.0)
    hook.after_val_epoch(runner)
    hook.after_train_iter(runner, 0)
    hub = {
        c.args[0]: c.args[1]
        for c in runner.message_hub.update_scalar.call_args_list
    }
    assert hub['stats/val/z/mean'] == 100.0
    assert hub['train/z/mean'] == 1.0  # the text line's short key


@pytest.mark.parametrize('action', ['warn', 'raise', 'ignore'])
def test_nonfinite_actions(action, caplog):
    hook = StatsCollectorHook(
        interval=2,
        collect_outputs=False,
        collect_timing=False,
        on_nonfinite=action)
    runner, published = mock_runner(100, IterBasedTrainLoop, 2)
    hook.before_run(runner)
    runner.iter = 0
    report('loss', 1.0)
    hook.after_train_iter(runner, 0)
    runner.iter = 1
    report('loss', math.nan)
    if action == 'raise':
        with pytest.raises(
                FloatingPointError, match=r'iteration 2 .*loss \(1 NaN/inf\)'):
            hook.after_train_iter(runner, 1)
        return
    with mmengine_logs(caplog):
        hook.after_train_iter(runner, 1)
    logged = warnings_logged(caplog)
    if action == 'warn':  # one warning, naming the iteration and the name
        assert len(logged) == 1, logged
        assert re.search(r'iteration 2 .*loss \(1 NaN/inf\)', logged[0])
    else:
        assert logged == []
    hub = {
        c.args[0]: c.args[1]
        for c in runner.message_hub.update_scalar.call_args_list
    }
    assert hub['train/loss/mean'] == 1.0  # the finite values
    assert hub['stats/loss/mean'] == 1.0
    if action == 'warn':
        assert hub['train/loss/nonfinite'] == 1.0  # in the log line
    else:
        assert 'train/loss/nonfinite' not in hub


def test_max_names_reaches_the_collectors():
    hook = StatsCollectorHook(max_names=2, collect_timing=False)
    for name in ('a', 'b', 'c'):
        report(name, 1.0)
    with pytest.warns(UserWarning):
        names = list(hook.collect('train'))
    assert names == ['a', 'b']  # the first in sorted order are admitted


def test_quantiles_are_published():
    hook = StatsCollectorHook(
        stats=('mean', 'p50', 'p99.9'), collect_timing=False)
    assert not StatsCollectorHook().collectors['train']._sketch
    values = np.arange(1., 1001.)
    report('x', torch.from_numpy(values))
    result = hook.collect('train')['x']
    for stat, q in (('p50', 0.5), ('p99.9', 0.999)):
        ref = np.quantile(values, q, method='lower')
        assert result[stat] == pytest.approx(ref, rel=0.01)
    assert result['mean'] == 500.5


def test_log_regex_keeps_names_out_of_the_text_line_only():
    hook = StatsCollectorHook(
        interval=1, collect_outputs=False, collect_timing=False)
    runner, published = mock_runner(100, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    runner.iter = 0
    report('loss', 1.0)
    report('modules/head/act', 2.0)
    report('modules/head/grad_norm', math.nan)
    hook.after_train_iter(runner, 0)
    hub = {
        c.args[0]: c.args[1]
        for c in runner.message_hub.update_scalar.call_args_list
    }
    text = {k[len('train/'):] for k in hub if k.startswith('train/')}
    assert text == {'loss/mean', 'modules/head/grad_norm/nonfinite'}
    assert hub['stats/modules/head/act/mean'] == 2.0  # everything else
    with pytest.raises(ValueError, match='log_regex'):
        StatsCollectorHook(log_regex='(')
