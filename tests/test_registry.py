"""Importing mmstats registers its hooks in its own scope and nothing else."""
import subprocess
import sys
import textwrap

from mmengine.registry import HOOKS as ROOT_HOOKS

from mmstats.hooks import PreciseBNHook, StatsCollectorHook
from mmstats.registry import HOOKS


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c',
                           textwrap.dedent(code)],
                          capture_output=True,
                          text=True,
                          timeout=120)


def test_users_can_register_the_demo_names_after_importing_mmstats():
    out = run_python("""
        import mmengine.runner  # noqa: F401  (torch adds DTensor globals)
        import mmengine.registry as root
        import torch
        safe_globals = getattr(torch.serialization, 'get_safe_globals', list)
        from mmengine.logging import HistoryBuffer
        safe_before = list(safe_globals())
        root.HOOKS.build(dict(type='mmstats.StatsCollectorHook'))
        import mmstats  # noqa: F401
        names = dict(MODELS=['ImageClassifier', 'ResNetMini',
                             'TensorDataPreprocessor'],
                     DATASETS=['DigitsDataset', 'SyntheticDigitsDataset'],
                     TRANSFORMS=['PackInputs', 'RandomShift'],
                     METRICS=['Accuracy'])
        for registry, classes in names.items():
            for name in classes:
                getattr(root, registry).register_module(
                    module=type(name, (), {}))
        safe_after = safe_globals()
        # torch registers its own classes when mmstats imports a torch
        # submodule (torch.compiler -> _dynamo, nested tensors): allowed;
        # anything from another package is not
        added = [g for g in safe_after if g not in safe_before]
        owners = {getattr(g[0] if isinstance(g, tuple) else g, '__module__',
                          '?').split('.')[0] for g in added}
        assert owners <= {'torch'}, added
        assert HistoryBuffer not in safe_after
        print('OK')
        """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith('OK')


def test_scope_prefix_builds_without_any_import():
    out = run_python("""
        from mmengine.registry import HOOKS
        hook = HOOKS.build(dict(type='mmstats.PreciseBNHook'))
        print(type(hook).__module__, type(hook).__name__)
        import sys
        print('digits_demo' in sys.modules)
        """)
    assert out.returncode == 0, out.stderr
    # the last lines: importing mmengine.runner may import an installed
    # DeepSpeed first, which logs its accelerator to stdout
    assert out.stdout.strip().split('\n')[-2:] == [
        'mmstats.hooks.precise_bn_hook PreciseBNHook', 'False'
    ]


def test_only_the_hooks_are_registered_and_only_in_the_mmstats_scope():
    assert HOOKS.scope == 'mmstats'
    assert HOOKS.get('PreciseBNHook') is PreciseBNHook
    assert HOOKS.get('StatsCollectorHook') is StatsCollectorHook
    assert set(HOOKS.module_dict) <= {
        'PreciseBNHook', 'StatsCollectorHook', 'ModuleStatsHook',
        'ThroughputHook', 'RandomStateHook', 'HangWatchHook', 'CheckpointHook'
    }
    for name in HOOKS.module_dict:
        assert ROOT_HOOKS.module_dict.get(name) is not HOOKS.get(name)


def test_unprefixed_checkpoint_hook_stays_mmengines():
    """mmstats.CheckpointHook shares mmengine's name: a config's unprefixed
    ``CheckpointHook`` still builds mmengine's (mmstats' launchers swap it
    in by name, ``use_safe_checkpoints``)."""
    from mmengine.hooks import CheckpointHook as MMEngineCheckpointHook

    from mmstats.hooks import CheckpointHook
    assert type(ROOT_HOOKS.build(dict(type='CheckpointHook'))) is \
        MMEngineCheckpointHook
    assert type(ROOT_HOOKS.build(dict(type='mmstats.CheckpointHook'))) is \
        CheckpointHook


def test_unprefixed_name_under_another_scope_is_not_ours():
    """The README's FAQ: only the 'mmstats.' prefix is unambiguous."""
    from mmengine.registry import DefaultScope, Registry
    other = Registry('hook', parent=ROOT_HOOKS, scope='otherpkg')

    @other.register_module(name='PreciseBNHook')
    class OtherPreciseBN:
        priority = 'NORMAL'

    with DefaultScope.overwrite_default_scope('otherpkg'):
        assert type(ROOT_HOOKS.build(dict(type='PreciseBNHook'))) is \
            OtherPreciseBN
        assert type(ROOT_HOOKS.build(dict(type='mmstats.PreciseBNHook'))) \
            is PreciseBNHook
