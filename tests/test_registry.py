"""The three ways a config can name mmstats' modules build the same class.

Each form runs in a fresh interpreter so that nothing is imported before
the config asks for it.
"""
import subprocess
import sys
import textwrap

import pytest

BUILD = textwrap.dedent('''
    import sys
    from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS, init_default_scope
    from mmengine.config import Config
    from mmengine.utils import import_modules_from_strings
    form = sys.argv[1]
    cfg = Config(dict(custom_imports=dict(imports=['mmstats'])))
    if form == 'prefix':
        names = dict(model='mmstats.ResNetMini', dataset='mmstats.DigitsDataset',
                     metric='mmstats.Accuracy')
    else:
        import_modules_from_strings(**cfg.custom_imports)
        if form == 'scope':
            init_default_scope('mmstats')
        names = dict(model='ResNetMini', dataset='DigitsDataset',
                     metric='Accuracy')
    model = MODELS.build(dict(type=names['model']))
    dataset = DATASETS.build(dict(type=names['dataset'], split='val'))
    metric = METRICS.build(dict(type=names['metric']))
    print(type(model).__module__, type(model).__name__)
    print(type(dataset).__module__, type(dataset).__name__, len(dataset))
    print(type(metric).__module__, type(metric).__name__)
''')


@pytest.mark.parametrize('form', ['prefix', 'scope', 'no_scope'])
def test_all_registry_forms_build_the_same_modules(form):
    out = subprocess.run([sys.executable, '-c', BUILD, form],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line for line in out.stdout.split('\n')
             if line.startswith('mmstats.')]  # not mmengine's log lines
    assert lines[0] == 'mmstats.models.resnet_mini ResNetMini'
    assert lines[1] == 'mmstats.datasets.digits DigitsDataset 359'
    assert lines[2] == 'mmstats.evaluation.accuracy Accuracy'


def test_prefix_form_needs_no_import():
    """``type='mmstats.X'`` works although nothing imported mmstats."""
    code = textwrap.dedent('''
        import sys
        from mmengine.registry import MODELS
        assert 'mmstats' not in sys.modules
        model = MODELS.build(dict(type='mmstats.ImageClassifier',
                                  backbone=dict(type='ResNetMini')))
        print(type(model).__name__, type(model.backbone).__name__)
    ''')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ['ImageClassifier', 'ResNetMini']


def test_child_registries_have_the_mmstats_scope_and_mmengine_parents():
    import mmengine.registry as root

    from mmstats import registry
    for name in ('HOOKS', 'MODELS', 'DATASETS', 'TRANSFORMS', 'METRICS'):
        child = getattr(registry, name)
        assert child.scope == 'mmstats'
        assert child.parent is getattr(root, name)
        assert root.__dict__[name]._children['mmstats'] is child


def test_root_registration_never_replaces_another_package_module():
    from mmengine.registry import MODELS as ROOT

    from mmstats.registry import MODELS

    class Dummy:
        pass

    existing = ROOT.get('BN')  # mmcv's BatchNorm2d
    MODELS.register_module(name='BN', module=Dummy, force=True)
    try:
        assert ROOT.get('BN') is existing
        assert MODELS.get('mmstats.BN') is Dummy
    finally:
        MODELS._module_dict.pop('BN')
