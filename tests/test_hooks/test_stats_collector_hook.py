"""StatsCollectorHook: build-time checks and the publication logic with a
mocked Runner, checked against the raw values (real Runners:
``test_stats_collector_runner.py``)."""
import math
import re
import time
from unittest.mock import MagicMock

import numpy as np
import pytest
import torch
from mmengine.hooks import LoggerHook
from mmengine.logging import MessageHub
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from mmstats import report
from mmstats.hooks import StatsCollectorHook
from mmstats.registry import HOOKS
from tests.helpers.logs import mmengine_logs, warnings_logged


# --------------------------------------------------------------- build time
# a wrong type is a TypeError, a wrong value a ValueError (mmstats.utils.args;
# before issue 29 some type mistakes here were ValueErrors)
@pytest.mark.parametrize('kwargs, error, match', [
    (dict(interval=0), ValueError, 'interval must be None or a positive int'),
    (dict(interval=2.5), TypeError, 'interval must be None or a positive'),
    (dict(interval=True), TypeError, 'interval must be None or a positive'),
    (dict(by_epoch='no'), TypeError, 'by_epoch must be True or False'),
    (dict(by_epoch=0), TypeError, 'by_epoch must be True or False'),
    (dict(by_epoch=1.0), TypeError, 'by_epoch must be True or False'),
    (dict(stats=('mean', 'median')), ValueError,
     'stats must be a non-empty list'),
    (dict(stats=()), ValueError, 'stats must be a non-empty list'),
    (dict(stats='mean'), TypeError, 'stats must be a non-empty list'),
    (dict(stats=None), TypeError, 'stats must be a non-empty list'),
    (dict(log_stats=('max', ),
          stats=('mean', )), ValueError, 'must be a subset'),
    (dict(regex='(unclosed'), ValueError, 'regex .* is not a valid regular'),
    (dict(regex=None), TypeError, 'regex must be a str'),
    (dict(log_regex=3), TypeError, 'log_regex must be a str'),
    (dict(prefix=''), ValueError, 'prefix must be a non-empty str'),
    (dict(prefix=1), TypeError, 'prefix must be a non-empty str'),
    (dict(health=dict(on_nonfinite='stop')), ValueError,
     'on_nonfinite must be one of'),
    (dict(health=dict(on_nonfinite=None)), TypeError,
     'on_nonfinite must be one of'),
    (dict(max_names=0), ValueError, 'max_names must be a positive int'),
    (dict(stats=('mean', 'p101')), ValueError, 'or quantiles "pNN"'),
    (dict(stats=('mean', 'p')), ValueError, 'or quantiles "pNN"'),
    (dict(max_names=2.0), TypeError, 'max_names must be a positive int'),
    (dict(max_names=True), TypeError, 'max_names must be a positive int'),
    (dict(collect='timing'), TypeError, r"collect must be a list of \("),
    (dict(collect=('timing', 'loss')), ValueError,
     r"\('timing', 'loss'\) \('loss' is none of them\)"),
    (dict(collect_timings=False), TypeError, r'did you mean collect\?'),
])
def test_invalid_arguments_fail_when_the_hook_is_built(kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        HOOKS.build(dict(type='StatsCollectorHook', **kwargs))
    assert type(info.value) is error


def test_the_flat_health_keywords_still_work_and_warn(caplog):
    """The keywords of earlier releases (deprecated): folded into
    ``health=dict(...)`` with one warning naming the new form, from a
    config too; both forms at once are refused naming both."""
    with mmengine_logs(caplog):
        hook = HOOKS.build(
            dict(
                type='StatsCollectorHook',
                on_nonfinite='raise',
                spike_factor=8,
                histogram_regex='loss',
                stats=('mean', 'p50')))
    assert warnings_logged(caplog) == [
        "StatsCollectorHook: on_nonfinite='raise', spike_factor=8, "
        "histogram_regex='loss' are deprecated (accepted until the next "
        "release); write health=dict(on_nonfinite='raise', spike_factor=8, "
        "histogram_regex='loss')"
    ]
    new = StatsCollectorHook(
        stats=('mean', 'p50'),
        health=dict(
            on_nonfinite='raise', spike_factor=8, histogram_regex='loss'))
    assert hook.health.config == new.health.config
    with pytest.raises(
            ValueError,
            match=r"spike_factor=8 \(deprecated\) "
            r"and health=\{'spike_window': 3\} are both given"):
        StatsCollectorHook(spike_factor=8, health=dict(spike_window=3))
    with pytest.raises(ValueError, match='spike_window must be a positive'):
        StatsCollectorHook(spike_window=0)  # checked as the new form
    with pytest.raises(TypeError, match='takes from 1 to 7 positional'):
        StatsCollectorHook(None, False, '.*', STATS, ('mean', ), 'stats',
                           True)  # collect_outputs, positional before 0.3


def test_the_collect_flags_still_work_and_warn(caplog):
    """``collect_outputs``/``collect_timing`` of earlier releases
    (deprecated): folded into ``collect=(...)`` with one warning naming
    the new form, from a config too; both forms at once are refused, and
    a flag is checked as before."""
    with mmengine_logs(caplog):
        hook = HOOKS.build(
            dict(type='StatsCollectorHook', collect_timing=False))
        quiet = HOOKS.build(
            dict(
                type='StatsCollectorHook',
                collect_outputs=False,
                collect_timing=False))
    assert warnings_logged(caplog) == [
        'StatsCollectorHook: collect_timing=False is deprecated (accepted '
        "until the next release); write collect=('outputs',)",
        'StatsCollectorHook: collect_outputs=False, collect_timing=False are '
        'deprecated (accepted until the next release); write collect=()'
    ]
    assert (hook.sources, quiet.sources) == (('outputs', ), ())
    assert StatsCollectorHook().sources == ('outputs', 'timing')
    with pytest.raises(
            ValueError,
            match=r"collect_timing=False \(deprecated\) and "
            r"collect=\('outputs',\) are both given"):
        StatsCollectorHook(collect_timing=False, collect=('outputs', ))
    with pytest.raises(TypeError, match='collect_outputs must be True or'):
        StatsCollectorHook(collect_outputs='no')


def test_registered_and_runs_before_the_logger_hook():
    from mmengine.runner.priority import get_priority
    hook = ROOT_HOOKS.build(dict(type='mmstats.StatsCollectorHook'))
    assert isinstance(hook, StatsCollectorHook)
    assert get_priority(hook.priority) < get_priority(LoggerHook.priority)


def test_inline_flags_in_regex():
    hook = StatsCollectorHook(regex='(?i)loss', collect=('outputs', ))
    hook.before_run(mock_runner(10)[0])
    report('LOSS', 1.0)
    report('acc', 1.0)
    assert list(hook.collect('train')) == ['LOSS']


STATS = ('mean', 'std', 'min', 'max')  # the hook's default


# ------------------------------------------------------ mocked-Runner logic
def mock_runner(epoch_len,
                loop=EpochBasedTrainLoop,
                logger_interval=None,
                ignore_last=True,
                max_iters=10**6):
    """A mocked Runner with a real MessageHub; ``published`` gets every
    ``(step, statistics)`` the hook sends to the visualizers."""
    runner = MagicMock()
    runner.train_loop = MagicMock(spec=loop)
    runner.train_dataloader = list(range(epoch_len))
    runner.max_iters = max_iters
    runner.log_processor.num_digits = 4
    runner.hooks = []
    if logger_interval:
        runner.hooks = [
            LoggerHook(interval=logger_interval, ignore_last=ignore_last)
        ]
    runner.message_hub = MessageHub(f'mock_{time.time_ns()}')
    published = []
    runner.visualizer.add_scalars.side_effect = (
        lambda scalars, step: published.append((step, dict(scalars))))
    return runner, published


@pytest.fixture
def mm_records():
    """Records logged through mmengine's current MMLogger (``print_log(...,
    'current')``), which does not propagate to pytest's caplog."""
    import logging

    from mmengine.logging import MMLogger

    class Keep(logging.Handler):

        def __init__(self):
            super().__init__(logging.DEBUG)
            self.records = []

        def emit(self, record):
            self.records.append(record)

    logger = MMLogger.get_current_instance()
    handler = Keep()
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def hub_values(runner) -> dict:
    """The current value of every message hub key."""
    return {
        key: buffer.current()
        for key, buffer in runner.message_hub.log_scalars.items()
    }


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
        interval=interval, collect=(), stats=('mean', 'num'))
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
    hook = StatsCollectorHook(collect=())
    runner, published = mock_runner(1000, IterBasedTrainLoop)
    hook.before_run(runner)
    drive(hook, runner, 25, 1000)
    assert [step for step, _ in published] == [10, 20]


def test_collect_outputs_reports_train_step_losses():
    hook = StatsCollectorHook(
        interval=2, stats=('mean', 'num'), collect=('outputs', ))
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
        interval=1, collect=(), stats=('mean', ), hub_regex='.*')
    runner, published = mock_runner(100, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    runner.iter, runner.epoch = 0, 0
    report('z', 1.0)
    hook.before_val_epoch(runner)
    report('z', 100.0)
    hook.after_val_epoch(runner)
    hook.after_train_iter(runner, 0)
    hub = hub_values(runner)
    assert hub['stats/val/z/mean'] == 100.0
    assert hub['train/z/mean'] == 1.0  # the text line's short key


@pytest.mark.parametrize('action', ['warn', 'raise', 'ignore'])
def test_nonfinite_actions(action, caplog):
    hook = StatsCollectorHook(
        interval=2,
        collect=(),
        health=dict(on_nonfinite=action),
        hub_regex='.*')
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
    hub = hub_values(runner)
    assert hub['train/loss/mean'] == 1.0  # the finite values
    assert hub['stats/loss/mean'] == 1.0
    if action == 'warn':
        assert hub['train/loss/nonfinite'] == 1.0  # in the log line
    else:
        assert 'train/loss/nonfinite' not in hub


def test_max_names_reaches_the_collectors():
    hook = StatsCollectorHook(max_names=2, collect=('outputs', ))
    hook.before_run(mock_runner(10)[0])
    for name in ('a', 'b', 'c'):
        report(name, 1.0)
    with pytest.warns(UserWarning):
        names = list(hook.collect('train'))
    assert names == ['a', 'b']  # the first in sorted order are admitted


def test_quantiles_are_published():
    hook = StatsCollectorHook(
        stats=('mean', 'p50', 'p99.9'), collect=('outputs', ))
    hook.before_run(mock_runner(10)[0])
    plain = StatsCollectorHook()
    plain.before_run(mock_runner(10)[0])
    assert not plain.collectors['train']._sketch
    values = np.arange(1., 1001.)
    report('x', torch.from_numpy(values))
    result = hook.collect('train')['x']
    for stat, q in (('p50', 0.5), ('p99.9', 0.999)):
        ref = np.quantile(values, q, method='lower')
        assert result[stat] == pytest.approx(ref, rel=0.01)
    assert result['mean'] == 500.5


def test_log_regex_keeps_names_out_of_the_text_line_only():
    hook = StatsCollectorHook(interval=1, collect=(), hub_regex='.*')
    runner, published = mock_runner(100, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    runner.iter = 0
    report('loss', 1.0)
    report('modules/head/act', 2.0)
    report('modules/head/grad_norm', math.nan)
    hook.after_train_iter(runner, 0)
    hub = hub_values(runner)
    text = {k[len('train/'):] for k in hub if k.startswith('train/')}
    assert text == {'loss/mean', 'modules/head/grad_norm/nonfinite'}
    assert hub['stats/modules/head/act/mean'] == 2.0  # everything else
    with pytest.raises(ValueError, match='log_regex'):
        StatsCollectorHook(log_regex='(')


# ------------------------------------- correct in the runs users launch
def test_a_user_pattern_cannot_escape_its_wrapper():
    # '^(?:a)|(b)$' would compile and let the training value 'b' into val/
    with pytest.raises(ValueError, match="regex 'a\\)\\|\\(b' is not a valid"):
        StatsCollectorHook(regex='a)|(b')


def test_building_the_hook_makes_nothing_live():
    from mmstats.stats.reporting import REPORTER

    def live():  # other tests' module-level collectors may be alive
        return {id(c) for c in REPORTER.live_collectors()}

    before = live()
    hook = StatsCollectorHook()
    assert hook.collectors == {} and live() == before
    runner, _ = mock_runner(10)
    hook.before_run(runner)
    assert len(live() - before) == 3
    hook.after_run(runner)
    assert hook.collectors == {} and live() == before


def test_a_nonfinite_count_belongs_to_its_interval_and_warns_once(mm_records):
    hook = StatsCollectorHook(interval=1, collect=())
    runner, published = mock_runner(100, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    for it in range(5):
        runner.iter = it
        if it == 1:
            report('x', [math.nan, 1.0])
        hook.after_train_iter(runner, it)
    counts = [scalars.get('stats/x/nonfinite') for _, scalars in published]
    assert counts == [1.0, 0.0, 0.0, 0.0]  # published from iteration 2 on
    warned = [r for r in mm_records if 'non-finite' in r.getMessage()]
    assert len(warned) == 1 and 'iteration 2' in warned[0].getMessage()
    assert hub_values(runner)['train/x/nonfinite'] == 0.0


def test_the_line_shows_no_stale_value_of_a_name_without_new_values():
    hook = StatsCollectorHook(interval=1, collect=(), keep_previous=False)
    runner, _ = mock_runner(100, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    runner.iter = 0
    report('x', 3.0)
    hook.after_train_iter(runner, 0)
    assert hub_values(runner)['train/x/mean'] == 3.0
    runner.iter = 1
    hook.after_train_iter(runner, 1)  # no value of x in iteration 2
    assert 'train/x/mean' not in hub_values(runner)


def test_outputs_and_a_model_report_of_the_same_name_stay_apart(mm_records):
    hook = StatsCollectorHook(
        interval=2, stats=('mean', 'num'), collect=('outputs', ))
    runner, published = mock_runner(100, IterBasedTrainLoop)
    hook.before_run(runner)
    per_sample = [[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]]
    for it in range(2):
        runner.iter = it
        report('loss', per_sample[it])  # the model's own, per sample
        batch_loss = torch.tensor(per_sample[it]).mean()
        hook.after_train_iter(runner, it, outputs=dict(loss=batch_loss))
    (step, scalars), = published
    assert scalars['stats/loss/num'] == 6 and scalars['stats/loss/mean'] == 4
    assert scalars['stats/train_step/loss/num'] == 2
    assert scalars['stats/train_step/loss/mean'] == 4
    warned = [r for r in mm_records if 'published apart' in r.getMessage()]
    assert len(warned) == 1


def test_the_last_iterations_of_an_iteration_based_run_are_published():
    hook = StatsCollectorHook(collect=(), stats=('num', 'mean'))
    runner, published = mock_runner(
        1000, IterBasedTrainLoop, logger_interval=10, max_iters=25)
    hook.before_run(runner)
    values = drive(hook, runner, 25, 1000)
    hook.after_train(runner)  # nothing left: no second publication
    assert [step for step, _ in published] == [10, 20, 25]
    assert published[-1][1]['stats/x/num'] == 5
    assert published[-1][1]['stats/x/mean'] == np.mean(values[20:])
    assert hook.publishes_after(runner, 24)  # ModuleStatsHook asks this


def test_a_run_that_stops_between_publications_publishes_the_rest():
    hook = StatsCollectorHook(interval=5, collect=(), stats=('num', 'mean'))
    runner, published = mock_runner(1000, IterBasedTrainLoop)
    hook.before_run(runner)
    values = drive(hook, runner, 7, 1000)
    hook.after_train(runner)
    assert [scalars['stats/x/num'] for _, scalars in published] == [5, 2]
    assert published[-1][1]['stats/x/mean'] == np.mean(values[5:])


def test_the_message_hub_stays_flat_over_many_publications():
    from mmstats.publish.layout import HUB_HISTORY
    hook = StatsCollectorHook(
        interval=1, collect=('outputs', ), hub_regex='.*')
    runner, _ = mock_runner(10**6, IterBasedTrainLoop, 1)
    hook.before_run(runner)
    for it in range(3 * HUB_HISTORY):
        runner.iter = it
        report('x', float(it))
        hook.after_train_iter(runner, it, outputs=dict(loss=torch.tensor(1.)))
    buffers = runner.message_hub.log_scalars
    assert len(buffers) == 10  # stats/{x,loss}/{4 stats} + 2 text keys
    assert all(
        len(b.data[0]) == (1 if key.startswith('train/') else HUB_HISTORY)
        for key, b in buffers.items())
    # nothing of ours is saved in (or warned about at the resume of) a
    # checkpoint
    assert runner.message_hub.state_dict()['log_scalars'] == {}
    assert runner.message_hub.state_dict()['resumed_keys'] == {}


def test_the_message_hub_gets_what_something_reads(monkeypatch):
    """By default a publication writes to the message hub the text line's
    keys only, in place (no ``HistoryBuffer.update``: no history copied),
    while the visualizer gets every statistic; ``hub_regex`` adds the
    keys of the names asked for, with their history."""
    from mmengine.logging import HistoryBuffer
    updates = []
    update = HistoryBuffer.update

    def counting_update(self, *args, **kwargs):
        updates.append(1)
        return update(self, *args, **kwargs)

    monkeypatch.setattr(HistoryBuffer, 'update', counting_update)
    for hub_regex, hub_names in ((None, 0), ('n1.*', 11)):
        hook = StatsCollectorHook(interval=1, collect=(), hub_regex=hub_regex)
        runner, published = mock_runner(100, IterBasedTrainLoop, 1)
        hook.before_run(runner)
        updates.clear()
        for it in range(3):
            runner.iter = it
            for i in range(50):
                report(f'n{i}', float(it + i))
            hook.after_train_iter(runner, it)
        hub = runner.message_hub.log_scalars
        text = {f'train/n{i}/mean' for i in range(50)}
        stats = {f'stats/n{i}/{s}' for i in range(50) for s in STATS}
        asked = {k for k in stats if k.startswith('stats/n1')}
        assert set(hub) - text == (asked if hub_regex else set())
        assert len(hub) - len(text) == 4 * hub_names
        assert all(hub[k].current() == 2 + int(k[7:-5]) for k in text)
        # the history kept where asked: 3 values, 2 updates each
        assert len(updates) == 2 * 4 * hub_names
        assert [step for step, _ in published] == [1, 2, 3]
        assert all(set(scalars) == stats for _, scalars in published)


def _slowest_rank_worker(rank, world):
    """Rank 1 waits for data in the first interval only, rank 0 in the
    second: each publication names the slowest rank of its own interval."""
    hook = StatsCollectorHook(interval=2, collect=('timing', ))
    runner, published = mock_runner(100, IterBasedTrainLoop)
    hook.before_run(runner)
    data_times = {0: [0.0, 0.0, 0.2, 0.0], 1: [0.3, 0.0, 0.0, 0.0]}[rank]
    for it, data_time in enumerate(data_times):
        runner.iter = it
        runner.message_hub.update_scalar('train/time', 0.5)
        runner.message_hub.update_scalar('train/data_time', data_time)
        hook.after_train_iter(runner, it)
    return [
        scalars['stats/data_time/slowest_rank'] for _, scalars in published
    ]


def test_the_slowest_rank_is_of_its_own_interval():
    from tests.helpers.dist import run_distributed
    for slowest in run_distributed(_slowest_rank_worker, 2):
        assert slowest == [1, 0]


def _slowest_by_data_time_worker(rank, world):
    """Rank 0 has the long iterations (``time``), rank 1 the long waits for
    data (``data_time``): the slowest rank is the one waiting for data."""
    hook = StatsCollectorHook(interval=2, collect=('timing', ))
    runner, published = mock_runner(100, IterBasedTrainLoop)
    hook.before_run(runner)
    time, data_time = {0: (2.0, 0.01), 1: (0.5, 0.3)}[rank]
    for it in range(4):
        runner.iter = it
        runner.message_hub.update_scalar('train/time', time)
        runner.message_hub.update_scalar('train/data_time', data_time)
        hook.after_train_iter(runner, it)
    return [
        scalars['stats/data_time/slowest_rank'] for _, scalars in published
    ]


def test_the_slowest_rank_is_chosen_by_data_time_not_time():
    from tests.helpers.dist import run_distributed
    for slowest in run_distributed(_slowest_by_data_time_worker, 2):
        assert slowest == [1, 1]
