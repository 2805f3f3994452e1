"""Importing mmstats and building every one of its hooks changes nothing
process-wide: no ``torch._dynamo`` (and its ``weights_only`` allowlist
entry), no ``mmengine.runner`` (which imports an installed DeepSpeed, and
DeepSpeed ``torch._dynamo``), the allowlist as ``mmengine.hooks`` (the
hooks' base class) leaves it. Each check runs in a fresh interpreter."""
import subprocess
import sys
import textwrap

import pytest

from mmstats.utils.torch_compat import torch_at_least


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c',
                           textwrap.dedent(code)],
                          capture_output=True,
                          text=True,
                          timeout=120)


def test_building_every_hook_imports_neither_dynamo_nor_the_runner():
    out = run_python("""
        import sys

        import torch
        safe_globals = getattr(torch.serialization, 'get_safe_globals', list)
        import mmengine.hooks  # noqa: F401  (its own allowlist entries)
        safe = list(safe_globals())
        # torch 2.1 imports dynamo with mmengine.hooks already
        dynamo_before = 'torch._dynamo' in sys.modules

        import mmstats
        from mmengine.registry import HOOKS as ROOT
        from mmstats.registry import HOOKS
        for name in mmstats.__all__:  # the lazy names too
            getattr(mmstats, name)
        built = []
        for name in sorted(HOOKS.module_dict):
            args = dict(modules='head') if name == 'ModuleStatsHook' else {}
            for registry in (HOOKS, ROOT):
                hook = registry.build(dict(type=f'mmstats.{name}', **args))
                built.append(type(hook).__name__)
        assert 'torch._dynamo' not in sys.modules or dynamo_before
        assert 'mmengine.runner' not in sys.modules
        assert safe_globals() == safe
        print('built', ' '.join(built))
        """)
    assert out.returncode == 0, out.stderr
    built = out.stdout.strip().split('\n')[-1].split()[1:]
    assert sorted(set(built)) == [
        'CheckpointHook', 'HangWatchHook', 'ModuleStatsHook', 'PreciseBNHook',
        'RandomStateHook', 'StatsCollectorHook', 'ThroughputHook'
    ] and len(built) == 14


def test_the_check_sees_what_a_runner_import_does():
    """The same process with ``mmengine.runner`` imported: the test above
    would see it (here, with DeepSpeed installed, ``torch._dynamo`` and
    its ``_DimRange`` entry in the allowlist too)."""
    out = run_python("""
        import importlib.util
        import sys

        import torch
        safe_globals = getattr(torch.serialization, 'get_safe_globals', list)
        import mmengine.hooks  # noqa: F401
        safe = list(safe_globals())
        import mmengine.runner  # noqa: F401
        added = [g for g in safe_globals()
                 if g not in safe]
        deepspeed = importlib.util.find_spec('deepspeed') is not None
        print(deepspeed, 'torch._dynamo' in sys.modules,
              any('_DimRange' in str(g) for g in added))
        """)
    assert out.returncode == 0, out.stderr
    deepspeed, dynamo, dim_range = out.stdout.strip().split('\n')[-1].split()
    if deepspeed != 'True':
        pytest.skip('DeepSpeed is not installed')
    assert dynamo == 'True'
    if torch_at_least('2.13'):  # dynamo's allowlist entry (not in 2.8)
        assert dim_range == 'True'
