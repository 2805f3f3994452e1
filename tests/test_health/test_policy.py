"""HealthPolicy without a Runner: what a publication's all-rank statistics
make it do (warn, raise, nothing), the messages, which names it watches
and draws, and its spike histories through a checkpoint."""
import math

import pytest

from mmstats.health import HealthConfig, HealthPolicy, SpikeError
from tests.helpers.logs import mmengine_logs, warnings_logged


def policy(**options):
    return HealthPolicy(HealthConfig(**options))


def results(**values):
    """``{name: {'max', 'mean', 'nonfinite'}}`` from ``name=(max, bad)``."""
    return {
        name.replace('__', '/'): dict(max=v, mean=v / 2, nonfinite=bad)
        for name, (v, bad) in values.items()
    }


def always(name):
    return True


@pytest.mark.parametrize('action', ['warn', 'raise', 'ignore'])
def test_nonfinite_actions_and_message(action, caplog):
    health = policy(on_nonfinite=action)
    assert health.flags_nonfinite == (action != 'ignore')
    published = results(loss=(1., 0), acc=(math.nan, 3))
    bad = health.nonfinite_counts(published)
    assert bad == {'acc': 3}
    assert not health.reports_nonfinite({})  # a healthy publication
    assert health.reports_nonfinite(bad) == (action != 'ignore')
    expected = ('StatsCollectorHook: non-finite values at iteration 8 '
                '(iterations 5-8 since the previous publication, over all '
                'ranks): acc (3 NaN/inf)')
    if action == 'raise':
        with pytest.raises(FloatingPointError) as info:
            health.nonfinite_found([], bad, 8, 4)
        assert str(info.value) == expected
        return
    with mmengine_logs(caplog):
        health.nonfinite_found([], bad, 8, 4)
    assert warnings_logged(caplog) == [expected]


def test_nonfinite_message_outside_training_names_the_interval(caplog):
    with mmengine_logs(caplog):
        policy().nonfinite_found([], {'val/acc': 1}, None, 0)
    assert warnings_logged(caplog) == [
        'StatsCollectorHook: non-finite values at this interval (since the '
        'previous publication, over all ranks): val/acc (1 NaN/inf)'
    ]


def feed(health, values, mode='train', is_new=always):
    """Publish ``loss`` = each of ``values``; the spikes of each."""
    return [
        health.check_spikes(mode, results(loss=(v, 0)), is_new) for v in values
    ]


def test_spikes_of_the_watched_training_names_only():
    health = policy(spike_regex='loss', spike_window=8)
    assert [s for s in feed(health, [1., 1.1, .9, 1., 1.]) if s] == []
    spikes, = feed(health, [10.])
    assert [(s.name, s.value, s.median) for s in spikes] == [('loss', 10., 1.)]
    # validation, another name, a kept (not new) value: never fed
    assert feed(health, [100.], mode='val') == [[]]
    assert health.check_spikes('train', results(acc=(100., 0)), always) == []
    assert feed(health, [100.], is_new=lambda name: False) == [[]]
    assert health.detector.history('loss') == [1., 1.1, .9, 1., 1., 10.]
    assert policy(spike_regex=None).check_spikes('train',
                                                 results(loss=(1., 0)),
                                                 always) == []


def test_spike_of_the_mean():
    health = policy(spike_stat='mean', spike_factor=1.5, spike_window=5)
    feed(health, [2.] * 5)
    spikes, = feed(health, [4.])  # mean 2.0 vs median 1.0
    assert spikes[0].value == 2.


@pytest.mark.parametrize('action', ['warn', 'raise'])
def test_spike_warned_or_handed_back_to_raise(action, caplog):
    health = policy(on_spike=action, spike_factor=4)
    feed(health, [1.] * 5)
    spikes, = feed(health, [40.])
    with mmengine_logs(caplog):
        error = health.spikes_found(spikes, {'loss': 3}, 16, 2)
    expected = (
        'StatsCollectorHook: spike in loss: max 40 is 40x the median 1 of '
        'its last 5 publications, largest value from rank 3 at iteration 16 '
        '(iterations 15-16 since the previous publication, over all ranks; '
        'spike_factor=4)')
    if action == 'raise':  # raised by the caller, once it wrote the numbers
        assert isinstance(error, SpikeError) and str(error) == expected
        assert warnings_logged(caplog) == []
    else:
        assert error is None and warnings_logged(caplog) == [expected]


def test_histogram_names_without_their_phase():
    health = policy(histogram_regex='loss|model/.*')
    assert health.writes_histograms
    assert [
        health.wants_histogram(n)
        for n in ('loss', 'val/loss', 'test/model/feat', 'loss_cls', 'acc')
    ] == [True, True, True, False, False]
    off = policy()
    assert not off.writes_histograms and not off.wants_histogram('loss')


def test_spike_histories_through_a_checkpoint():
    health = policy(spike_window=4)
    feed(health, [1., 2., 3., 4., 5.])
    state = health.state_dict()
    assert state == {'loss': [2., 3., 4., 5.]}
    resumed = policy(spike_window=4)
    resumed.load_state_dict(state)  # loaded before or after begin_run
    resumed.begin_run()
    assert resumed.detector.history('loss') == [2., 3., 4., 5.]
    resumed.load_state_dict(None)  # a checkpoint without them
    assert resumed.detector.history('loss') == [2., 3., 4., 5.]
    resumed.end_run()  # the next run starts empty
    resumed.begin_run()
    assert resumed.detector.history('loss') == []
    assert policy(spike_regex=None).state_dict() is None
