"""SpikeDetector alone: the rule of its docstring, value by value
(``|value| > factor * median(|history|)``, on magnitudes)."""
import math

import pytest

from mmstats.health.spikes import MIN_HISTORY, Spike, SpikeDetector


def _fed(values, factor=4., window=20, name='x'):
    """A detector that saw ``values`` of ``name`` without a spike."""
    detector = SpikeDetector(factor=factor, window=window)
    for value in values:
        assert detector.check({name: value}) == [], value
    return detector


def test_a_statistic_turning_very_negative_spikes():
    """History of magnitude ~1 with both signs: -5 spikes as +5 does."""
    history = [1.0, -0.9, 1.1, -0.8, 1.0]
    for value in (-5.0, 5.0):
        detector = _fed(history)
        assert detector.check({'x': value}) == [Spike('x', value, 1.0, 5.0, 5)]
    detector = _fed(history)
    assert detector.check({'x': -3.9}) == []  # 3.9 x the median: none


def test_a_negative_statistic_spikes_on_its_magnitude():
    """A statistic that is always negative (a log-likelihood): its median
    magnitude is 2; -9 spikes, -7 does not."""
    history = [-2.0, -2.2, -1.8, -2.0, -2.1]
    detector = _fed(history, name='ll')
    assert detector.check({'ll': -7.0}) == []  # 3.5 x the median: none
    detector = _fed(history, name='ll')
    assert detector.check({'ll': -9.0}) == [Spike('ll', -9.0, 2.0, 4.5, 5)]
    # its own history keeps the signed values
    assert detector.history('ll') == history + [-9.0]


def test_history_rules():
    detector = SpikeDetector(factor=4., window=6)
    # no spike before MIN_HISTORY values, however large the jump
    for value in (1.0, ) * (MIN_HISTORY - 1):
        assert detector.check({'x': value}) == []
    assert detector.check({'x': 1e6}) == []  # 4 values of history only
    assert detector.history('x') == [1.0] * 4 + [1e6]
    # non-finite values are skipped and stay out of the history
    assert detector.check({'x': math.nan, 'y': math.inf}) == []
    assert detector.history('x') == [1.0] * 4 + [1e6]
    assert detector.history('y') == []
    # the median ignores the one outlier: 1.0; the window keeps 6 values
    assert detector.check({'x': 4.5}) == [Spike('x', 4.5, 1.0, 4.5, 5)]
    assert detector.check({'x': 1.0}) == []
    assert detector.history('x') == [1.0] * 3 + [1e6, 4.5, 1.0]
    # names in any order, spikes sorted by name; a zero median never spikes
    several = _fed([0.0] * 5, name='z')
    for _ in range(5):
        assert several.check({'b': 1.0, 'a': -2.0}) == []
    spikes = several.check({'z': 1.0, 'b': -8.0, 'a': 9.0})
    assert spikes == [
        Spike('a', 9.0, 2.0, 4.5, 5),
        Spike('b', -8.0, 1.0, 8.0, 5)
    ]
    detector.reset()
    assert detector.history('x') == []


def test_a_lasting_jump_becomes_the_new_normal():
    """After window // 2 publications at the new level the median moves:
    one warning per publication until then."""
    detector = _fed([1.0] * 6, window=6)
    spiked = [bool(detector.check({'x': -10.0})) for _ in range(5)]
    assert spiked == [True, True, True, False, False]


@pytest.mark.parametrize('kwargs, error', [
    (dict(factor=1.0), ValueError),
    (dict(factor=math.inf), ValueError),
    (dict(factor='4'), TypeError),
    (dict(factor=True), TypeError),
    (dict(window=0), ValueError),
    (dict(window=True), ValueError),
])
def test_bad_arguments(kwargs, error):
    with pytest.raises(error, match=f'SpikeDetector: {next(iter(kwargs))}'):
        SpikeDetector(**kwargs)


def test_history_survives_a_state_dict_round_trip():
    detector = SpikeDetector(factor=4., window=3)
    for loss in (1.0, 2.0, 3.0, 4.0):
        detector.check({'loss': loss})
    state = detector.state_dict()
    assert state == {'loss': [2.0, 3.0, 4.0]}  # plain floats: a checkpoint
    resumed = SpikeDetector(factor=4., window=2)
    resumed.load_state_dict(state)
    assert resumed.history('loss') == [3.0, 4.0]  # its own window
