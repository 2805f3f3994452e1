"""The same argument mistake gets the same answer from every public entry
point: a wrong type is a TypeError, a wrong value a ValueError, and the
message names the owner, the argument, what it must be and what was given
(``mmstats.utils.args``): ``Collector(max_names=True)`` and
``StatsCollectorHook(max_names=True)`` raise the same TypeError.

Mistakes beyond one argument get the fix as well, on every mmstats hook: a
misspelt keyword names the closest argument (built from a config or
called), a second instance of a hook in one run is refused at
``before_run`` naming both, and a ``modules`` alternative of
ModuleStatsHook that matches no module name is warned about once, with
the model's closest names."""
import re

import pytest
import torch.nn as nn

import mmstats.hooks
from mmstats import Collector, training_stats, update_bn_stats
from mmstats.health import HealthConfig
from mmstats.hooks import ModuleStatsHook, PreciseBNHook, StatsCollectorHook
from mmstats.registry import HOOKS
from mmstats.utils import args
from tests.helpers.logs import mmengine_logs, warnings_logged
from tests.helpers.runner import read_scalars, toy_cfg


def bn_stats(**kwargs):
    kwargs.setdefault('num_samples', 8)
    kwargs.setdefault('progress', False)
    update_bn_stats(nn.BatchNorm1d(2), [], **kwargs)


def stats_collector(**kwargs):
    """StatsCollectorHook, its health options in ``health=dict(...)``."""
    health = {k: kwargs.pop(k) for k in HealthConfig.names() if k in kwargs}
    return StatsCollectorHook(health=health, **kwargs)


OWNERS = {
    'Collector': Collector,
    'StatsCollectorHook': stats_collector,
    'PreciseBNHook': PreciseBNHook,
    'update_bn_stats': bn_stats,
    'training_stats.Collector': training_stats.Collector,
    'ModuleStatsHook': lambda **kw: ModuleStatsHook(**{
        'modules': 'x',
        **kw
    }),
}

# (owner, argument, a wrong value, the exception, what the message says)
CASES = [
    # flags: types are checked, not truthiness
    *[(owner, name, bad, TypeError, 'must be True or False')
      for owner, name in (('Collector', 'keep_previous'),
                          ('Collector', 'sketch'),
                          ('StatsCollectorHook', 'keep_previous'),
                          ('StatsCollectorHook', 'by_epoch'),
                          ('PreciseBNHook', 'at_end'),
                          ('update_bn_stats', 'progress'),
                          ('training_stats.Collector', 'keep_previous'))
      for bad in (1, None, 'yes')],
    # positive ints
    *[(owner, name, bad, error, 'a positive int')
      for owner, name in (('Collector', 'max_names'),
                          ('Collector', 'evict_after'),
                          ('StatsCollectorHook', 'max_names'),
                          ('StatsCollectorHook', 'interval'),
                          ('PreciseBNHook', 'num_samples'),
                          ('PreciseBNHook', 'interval'),
                          ('update_bn_stats', 'num_samples'))
      for bad, error in ((True, TypeError), (2.5, TypeError), ('8', TypeError),
                         (0, ValueError), (-1, ValueError))],
    # regular expressions
    *[(owner, 'regex', bad, error, what)
      for owner in ('Collector', 'StatsCollectorHook',
                    'training_stats.Collector')
      for bad, error, what in ((None, TypeError, 'must be a str'),
                               (3, TypeError, 'must be a str'),
                               ('(', ValueError, 'is not a valid regular'))],
    # one of a few strings
    *[(owner, name, bad, error, 'must be one of')
      for owner, name in (('StatsCollectorHook', 'on_nonfinite'),
                          ('PreciseBNHook', 'estimator'),
                          ('update_bn_stats', 'estimator'))
      for bad, error in (('nope', ValueError), (None, TypeError))],
    # ModuleStatsHook's statistics and prefix
    *[('ModuleStatsHook', 'stats', bad, error, 'must be a non-empty list')
      for bad, error in (('act', TypeError), (None, TypeError),
                         ((), ValueError), (('typo', ), ValueError))],
    *[('ModuleStatsHook', 'prefix', bad, error, 'must be a non-empty str')
      for bad, error in ((1, TypeError), ('', ValueError))],
]


@pytest.mark.parametrize(
    'owner, name, bad, error, what',
    CASES,
    ids=[f'{c[0]}-{c[1]}-{c[2]!r}' for c in CASES])
def test_the_same_mistake_gets_the_same_answer(owner, name, bad, error, what):
    with pytest.raises(Exception) as info:
        OWNERS[owner](**{name: bad})
    assert type(info.value) is error, (type(info.value), str(info.value))
    message = str(info.value)
    assert message.startswith(f'{owner}: {name} '), message
    assert what in message and repr(bad) in message, message
    if error is TypeError and what != 'must be a str':
        assert f'of type {type(bad).__name__}' in message, message


def test_messages_say_the_fix():
    with pytest.raises(TypeError) as flag:
        args.check_bool('X', 'keep', 1)
    assert str(flag.value) == ('X: keep must be True or False, got 1 of type '
                               'int; write keep=True or keep=False')
    with pytest.raises(ValueError) as number:
        args.check_positive_int('X', 'n', 0, example=8)
    assert str(number.value) == 'X: n must be a positive int (e.g. n=8), got 0'
    with pytest.raises(ValueError, match=re.escape("X: r '(' is not a valid")):
        args.compile_regex('X', 'r', '(')
    assert args.check_positive_int('X', 'n', None, none_ok=True) is None
    assert args.check_bool('X', 'b', None, none_ok=True) is None


# -- a misspelt keyword ----------------------------------------------------
HOOK_NAMES = sorted(HOOKS.module_dict)


def test_every_mmstats_hook_is_covered():
    assert set(HOOK_NAMES) >= set(mmstats.hooks.__all__)
    assert len(HOOK_NAMES) >= 4


def _misspelt(name):
    """``num_samples`` -> ``num_sample``, ``interval`` -> ``intervl``."""
    return name[:-1] if name.endswith('s') else name[:-2] + name[-1]


@pytest.mark.parametrize('built', [True, False], ids=['config', 'call'])
@pytest.mark.parametrize('owner', HOOK_NAMES)
def test_a_misspelt_keyword_names_the_closest_argument(owner, built):
    import inspect
    cls = HOOKS.get(f'mmstats.{owner}')
    names = list(inspect.signature(cls).parameters)
    if not names:  # RandomStateHook: any keyword is refused by name
        with pytest.raises(
                TypeError,
                match=f'{owner}: unexpected keyword '
                "argument 'interval'; .*takes no arguments"):
            HOOKS.build(dict(type=f'mmstats.{owner}', interval=1))
        return
    for name in names:
        wrong = _misspelt(name)
        with pytest.raises(TypeError) as info:
            if built:
                HOOKS.build(dict(type=f'mmstats.{owner}', **{wrong: 1}))
            else:
                cls(**{wrong: 1})
        message = str(info.value)
        assert f'{owner}: unexpected keyword argument {wrong!r}; did you ' \
            f'mean {name}? {owner} takes {", ".join(names)}' in message


def test_a_misspelt_health_option_names_the_new_form():
    with pytest.raises(TypeError) as info:
        HOOKS.build(dict(type='mmstats.StatsCollectorHook', spike_facto=8))
    assert str(info.value).startswith(
        "StatsCollectorHook: unexpected keyword argument 'spike_facto'; did "
        'you mean health=dict(spike_factor=...)? StatsCollectorHook takes '
        'interval, ')
    with pytest.raises(
            TypeError,
            match="unexpected key 'spike_facto'; did "
            'you mean spike_factor'):
        StatsCollectorHook(health=dict(spike_facto=8))


def test_precise_bn_num_sample():
    with pytest.raises(TypeError) as info:
        PreciseBNHook(num_sample=1024)
    assert str(info.value) == (
        "PreciseBNHook: unexpected keyword argument 'num_sample'; did you "
        'mean num_samples? PreciseBNHook takes num_samples, interval, '
        'by_epoch, at_end, estimator, dataloader, update_ema, progress')
    # nothing close: the arguments only; the right keywords still work
    with pytest.raises(
            TypeError,
            match=r"'zzz'; ThroughputHook takes "
            r'interval, count_flops, peak_flops$'):
        HOOKS.build(dict(type='mmstats.ThroughputHook', zzz=1))
    assert PreciseBNHook(num_samples=16, progress=False).num_samples == 16
    assert PreciseBNHook(16).num_samples == 16  # positionally too


def test_check_keywords_leaves_var_keyword_alone():

    class Open:

        def __init__(self, **kwargs):
            self.kwargs = kwargs

    assert args.check_keywords(Open).__init__ is Open.__init__
    assert Open(anything=1).kwargs == {'anything': 1}


# -- a second instance -----------------------------------------------------
SECOND = {
    'StatsCollectorHook': dict(),
    'ModuleStatsHook': dict(modules='head'),
    'PreciseBNHook': dict(num_samples=16, progress=False),
    'ThroughputHook': dict(),
}


@pytest.mark.parametrize('owner', sorted(SECOND))
def test_a_second_instance_is_refused_at_before_run(tmp_path, owner,
                                                    clean_mmengine):
    from mmengine.runner import Runner
    hook = dict(type=f'mmstats.{owner}', **SECOND[owner])
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=2,
        custom_hooks=[hook, dict(hook, priority='LOW')])
    runner = Runner.from_cfg(cfg)
    cls = HOOKS.get(f'mmstats.{owner}')
    first, second = [
        i for i, h in enumerate(runner.hooks) if isinstance(h, cls)
    ]
    normal = getattr(cls.priority, 'name', cls.priority)
    with pytest.raises(RuntimeError) as info:
        runner.train()
    assert str(info.value) == (
        f'{owner}: 2 instances in one run, runner.hooks[{first}] (priority '
        f'{normal}) and runner.hooks[{second}] (priority LOW); a run takes '
        f"one: keep one dict(type='mmstats.{owner}', ...) in custom_hooks, "
        'with the arguments of both')
    assert runner.iter == 0  # refused before the first iteration


def test_one_instance_of_each_hook_trains(tmp_path, clean_mmengine):
    from mmengine.runner import Runner
    cfg = toy_cfg(
        tmp_path,
        by_epoch=False,
        max_iters=2,
        custom_hooks=[
            dict(type=f'mmstats.{owner}', **kwargs)
            for owner, kwargs in SECOND.items()
        ])
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 2


# -- a modules alternative that matches nothing ----------------------------
@pytest.mark.parametrize(
    'regex, parts',
    [
        ('a', ['a']),
        (r'backbone\.layer\d|head', [r'backbone\.layer\d', 'head']),
        (r'(a|b)|c', ['(a|b)', 'c']),  # inside parentheses
        (r'x(?:a|(b|c))y|d', ['x(?:a|(b|c))y', 'd']),  # nested
        (r'[|]|a\|b', ['[|]', r'a\|b']),  # a class, an escaped bar
        (r'[]|]|x', ['[]|]', 'x']),  # ']' first in a class is literal
        (r'[^]|]|x', ['[^]|]', 'x']),
        (r'[\]|]|x', [r'[\]|]', 'x']),  # an escaped ']' in a class
        (r'(?i)a|b', ['a', 'b']),  # global flags: on every alternative
        ('(?x) a # b|c\n | d', [' a # b|c\n ', ' d']),  # verbose comment
        ('a|', ['a', '']),
    ])
def test_split_alternatives(regex, parts):
    assert args.split_alternatives(regex) == parts


def test_unmatched_alternatives():
    names = ['backbone', 'backbone.stem', 'backbone.layer1', 'head']
    unmatched = args.unmatched_alternatives
    assert unmatched(r'backbone\.blocks\d|head',
                     names) == [r'backbone\.blocks\d']
    assert unmatched(r'nope|x|head', names) == ['nope', 'x']
    assert unmatched(r'(?i)HEAD|BACKBONE', names) == []  # flags apply
    assert unmatched(r'backbone\.(stem|nope)', names) == []  # one only
    assert unmatched(r'(b)ackbone|\1', names) == []  # \1 is not judged
    assert unmatched('nothing', names) == []  # the hook refuses this one


def _module_stats_run(work_dir, modules, caplog, trains=1):
    from mmengine.runner import Runner
    cfg = toy_cfg(
        work_dir,
        by_epoch=False,
        max_iters=2,
        custom_hooks=[
            dict(type='mmstats.StatsCollectorHook'),
            dict(type='mmstats.ModuleStatsHook', modules=modules)
        ])
    runner = Runner.from_cfg(cfg)
    with mmengine_logs(caplog):
        for _ in range(trains):
            runner.train()
    said = [m for m in warnings_logged(caplog) if 'alternative' in m]
    return said, read_scalars(runner)


def test_an_alternative_that_matches_nothing_is_warned_once(
        tmp_path, caplog, clean_mmengine):
    said, scalars = _module_stats_run(
        tmp_path, r'backbone\.blocks\d|head', caplog, trains=2)
    assert len(said) == 1, said  # two runner.train(): said once
    part, whole = repr(r'backbone\.blocks\d'), repr(r'backbone\.blocks\d|head')
    head = (f'ModuleStatsHook: modules={whole}: the '
            f'alternative {part} matches no module name of ToyBNModel '
            '(re.fullmatch), so only head is instrumented; the module names '
            f'closest to {part}: ')
    assert said[0].startswith(head), said
    near = said[0][len(head):].split(', ')
    assert len(near) == 5 and 'backbone.stem' in near, near
    assert set(near) <= {
        'backbone', 'backbone.stem', 'backbone.stem.conv', 'backbone.stem.bn',
        'backbone.layer1', 'backbone.layer1.0', 'backbone.layer1.1',
        'backbone.layer1.2', 'data_preprocessor'
    }
    # the alternative that matched is instrumented
    assert 'stats/modules/head/act/mean' in scalars[2]


def test_every_alternative_matching_is_not_warned(tmp_path, caplog,
                                                  clean_mmengine):
    said, scalars = _module_stats_run(tmp_path,
                                      r'(?i)HEAD|backbone\.(stem|nope)',
                                      caplog)
    assert said == []
    assert 'stats/modules/backbone.stem/act/mean' in scalars[2]
