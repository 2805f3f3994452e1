"""The README's config snippets work as written.

Every snippet loads with ``Config.fromfile`` and its hooks build. Those
that inherit from mmpretrain / mmdet / mmseg (``_base_ = ['pkg::...']``)
need the package: without it mmengine must say so (not fail on a missing
``pkg_resources``: setuptools >= 81 no longer ships it); with mmpretrain the
whole Runner is built.
"""
import os.path as osp
import re

import pytest
from mmengine.config import Config
from mmengine.registry import HOOKS, DefaultScope

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
PACKAGES = {'mmpretrain': 'mmpretrain', 'mmdet': 'mmdet', 'mmseg': 'mmseg'}
HEALTH_CONFIG = ('projects/digits_demo/configs/health/'
                 'resnet-mini_1xb64-health_digits.py')


def config_snippets() -> list:
    with open(osp.join(ROOT, 'README.md')) as f:
        text = f.read()
    section = text.split('\n## Configs\n')[1].split('\n## ')[0]
    return re.findall(r'```python\n(.*?)```', section, re.S)


def snippet_package(snippet: str):
    match = re.search(r"_base_ = \['(\w+)::", snippet)
    return match.group(1) if match else None


def test_readme_shows_a_snippet_per_package():
    packages = [snippet_package(s) for s in config_snippets()]
    assert packages == [None, 'mmpretrain', 'mmdet', 'mmseg']


def test_pkg_resources_is_there_for_pkg_bases():
    """mmengine 0.10.7 resolves ``pkg::`` bases with pkg_resources
    (requirements/runtime.txt: setuptools<81)."""
    from mmengine.utils import is_installed
    assert is_installed('mmengine')


@pytest.mark.parametrize('index', range(4))
def test_readme_config_snippet_loads_and_builds_its_hooks(tmp_path, index):
    snippet = config_snippets()[index]
    package = snippet_package(snippet)
    path = tmp_path / 'snippet.py'
    path.write_text(snippet)
    if package is not None:
        try:
            __import__(package)
        except ImportError:
            with pytest.raises(
                    ModuleNotFoundError,
                    match=f'{package}.* is not installed'):
                Config.fromfile(str(path))
            pytest.skip(f'{package} is not installed (mmengine says so)')
    cfg = Config.fromfile(str(path))
    assert cfg.custom_hooks
    # mmstats' hooks build under any scope (and none)
    ours = [h for h in cfg.custom_hooks if h['type'].startswith('mmstats.')]
    assert ours
    for hook in ours:
        assert type(HOOKS.build(dict(hook))).__module__.startswith('mmstats.')
    # all of them in the config's scope, as the Runner builds them
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        try:
            hooks = [HOOKS.build(dict(hook)) for hook in cfg.custom_hooks]
        except ModuleNotFoundError as exc:
            if 'mmcv._ext' not in str(exc):
                raise
            # mmdet / mmseg import their models with the scope: they need
            # the full mmcv (compiled ops), not mmcv-lite
            pytest.skip(f'{package} needs compiled mmcv.ops ({exc})')
    assert len(hooks) == len(cfg.custom_hooks)


def test_readme_mmpretrain_snippet_builds_a_runner(tmp_path, clean_mmengine):
    """With mmpretrain installed, its whole config and mmstats' hooks build
    a Runner (the ImageNet data is read only when training starts)."""
    pytest.importorskip('mmpretrain', reason='mmpretrain is not installed')
    from mmengine.runner import Runner
    snippet = config_snippets()[1]
    path = tmp_path / 'snippet.py'
    path.write_text(snippet)
    cfg = Config.fromfile(str(path))
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    types = [type(h).__module__ + '.' + type(h).__name__ for h in runner.hooks]
    for name in ('PreciseBNHook', 'StatsCollectorHook', 'ModuleStatsHook'):
        assert any(
            t.startswith('mmstats.') and t.endswith(name)
            for t in types), types


def test_readme_training_health_is_the_config_file_and_builds(tmp_path):
    """The "Training health" section shows one config: the file
    ``projects/digits_demo/configs/health/...`` from ``_base_`` on, as is;
    it loads and builds every hook it names (argument checks run when a
    hook is built), with TensorBoard among the visualizer's backends."""
    with open(osp.join(ROOT, 'README.md')) as f:
        text = f.read()
    section = text.split('\n## Training health\n')[1].split('\n## ')[0]
    snippets = re.findall(r'```python\n(.*?)```', section, re.S)
    assert len(snippets) == 1
    path = osp.join(ROOT, HEALTH_CONFIG)
    assert HEALTH_CONFIG in section
    with open(path) as f:
        source = f.read()
    assert snippets[0] == source[source.index('_base_ = '):]
    cfg = Config.fromfile(path)
    built = [
        type(HOOKS.build(dict(hook))).__name__ for hook in cfg.custom_hooks
    ]
    assert built == [
        'PreciseBNHook', 'StatsCollectorHook', 'ModuleStatsHook',
        'ThroughputHook', 'HangWatchHook'
    ]
    backends = [b['type'] for b in cfg.visualizer['vis_backends']]
    assert backends == ['LocalVisBackend', 'TensorboardVisBackend']
