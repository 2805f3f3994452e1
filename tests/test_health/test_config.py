"""HealthConfig: StatsCollectorHook's ``health=dict(...)``, checked when it
is built (a wrong type a TypeError, a wrong value a ValueError, naming the
option and the fix), and the flat keywords of earlier releases folded in
with one warning (no Runner)."""
import re

import pytest

from mmstats.health import MAX_BUCKETS, HealthConfig, fold_flat_health
from tests.helpers.logs import mmengine_logs, warnings_logged


def test_defaults_are_the_hooks_earlier_defaults():
    config = HealthConfig.build(None)
    assert config == HealthConfig(
        on_nonfinite='warn',
        spike_regex='loss',
        spike_stat='max',
        spike_factor=4.,
        spike_window=20,
        on_spike='warn',
        histogram_regex=None,
        histogram_buckets=MAX_BUCKETS)
    assert HealthConfig.build(config) is config
    assert HealthConfig.build(dict(spike_factor=8)).spike_factor == 8


@pytest.mark.parametrize('options, error, text', [
    (dict(on_nonfinite='stop'), ValueError,
     "on_nonfinite must be one of ('warn', 'raise', 'ignore'), got 'stop'"),
    (dict(on_nonfinite=None), TypeError, 'on_nonfinite must be one of'),
    (dict(on_spike='ignore'), ValueError, 'on_spike must be one of'),
    (dict(spike_stat='p99'), ValueError, 'spike_stat must be one of'),
    (dict(spike_factor=1.), ValueError, 'spike_factor must be a finite '
     'number > 1 (e.g. health=dict(spike_factor=4.0)), got 1.0'),
    (dict(spike_factor=float('inf')), ValueError, 'spike_factor must be'),
    (dict(spike_factor=True), TypeError, 'spike_factor must be'),
    (dict(spike_window=0), ValueError, 'spike_window must be a positive int '
     '(e.g. health=dict(spike_window=20)), got 0'),
    (dict(spike_window=2.), TypeError, 'spike_window must be a positive'),
    (dict(histogram_buckets=0), ValueError,
     'histogram_buckets must be a positive int'),
    (dict(spike_regex='loss('), ValueError,
     "spike_regex 'loss(' is not a valid regular expression"),
    (dict(histogram_regex=3), TypeError, 'histogram_regex must be a str'),
])
def test_each_mistake_names_the_option(options, error, text):
    with pytest.raises(error) as info:
        HealthConfig.build(options)
    assert type(info.value) is error
    assert str(info.value).startswith('StatsCollectorHook: ')
    assert text in str(info.value)


def test_an_unknown_key_names_the_closest_and_a_wrong_type_the_form():
    with pytest.raises(TypeError) as info:
        HealthConfig.build(dict(spike_windw=3))
    assert str(info.value).startswith(
        "StatsCollectorHook: health got an unexpected key 'spike_windw'; did "
        'you mean spike_window? health takes on_nonfinite, spike_regex, ')
    with pytest.raises(
            TypeError,
            match=r"health must be None or a dict .*"
            r"got \['loss'\] of type list"):
        HealthConfig.build(['loss'])


def test_histograms_need_a_quantile():
    HealthConfig(histogram_regex='loss').check_sketching(True)
    HealthConfig().check_sketching(False)  # no histogram: no sketch needed
    with pytest.raises(
            ValueError,
            match=re.escape("histogram_regex='loss' needs quantile sketches")):
        HealthConfig(histogram_regex='loss').check_sketching(False)


def test_flat_keywords_fold_in_with_one_warning(caplog):
    with mmengine_logs(caplog):
        assert fold_flat_health(None, {}) is None  # nothing flat: no word
        assert fold_flat_health(dict(on_spike='raise'),
                                {}) == dict(on_spike='raise')
        assert warnings_logged(caplog) == []
        folded = fold_flat_health(None, dict(spike_factor=8))
    assert folded == dict(spike_factor=8)
    assert warnings_logged(caplog) == [
        'StatsCollectorHook: spike_factor=8 is deprecated (accepted until '
        'the next release); write health=dict(spike_factor=8)'
    ]


@pytest.mark.parametrize('health', [
    dict(spike_window=3),
    dict(spike_factor=4),
    HealthConfig(),
])
def test_both_forms_at_once_are_refused_naming_both(health):
    with pytest.raises(ValueError) as info:
        fold_flat_health(health, dict(spike_factor=8))
    message = str(info.value)
    assert 'spike_factor=8 (deprecated) and health=' in message
    assert 'write them in one: health=dict(' in message
