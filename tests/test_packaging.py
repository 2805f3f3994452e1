"""The package users install by its name: metadata, versions, and a wheel
that trains a config with ``type='mmstats.X'`` hooks from a plain install.

The wheel test builds an sdist and a wheel with ``python -m build`` (no
isolation: the build uses this environment's setuptools, so it runs
offline), installs the wheel (not editable) into a fresh virtual
environment and trains there. The new environment must not see the
editable install of this checkout, yet torch and mmengine are too big to
install again: it is created ``--without-pip`` and gets a ``.pth`` file
naming this environment's site-packages. A directory named in a ``.pth``
file goes on ``sys.path`` but its own ``.pth`` files (the editable
finder) are not run, so ``import mmstats`` can only find the wheel's copy;
the test checks that ``mmstats.__file__`` is inside the new environment.
"""
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import mmengine
import pytest
import torch

import mmstats
from mmstats.utils.compat import (MIN_MMENGINE, MIN_TORCH, check_version,
                                  release)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DIST_NAME = 'mmengine-stats'


def _read(path):
    with open(osp.join(ROOT, path)) as f:
        return f.read()


def test_metadata_matches_what_is_tested():
    """setup.py, requirements/runtime.txt, the import check and the
    README's Supported line state the same versions."""
    setup_py = _read('setup.py')
    assert f"name='{DIST_NAME}'" in setup_py
    assert "python_requires='>=3.11'" in setup_py
    runtime = _read('requirements/runtime.txt')
    assert not re.search(r'^(torch|mmengine)', runtime, re.M)  # the user's
    assert f'torch>={MIN_TORCH}\n' in _read('requirements/torch.txt')
    assert f'mmengine>={MIN_MMENGINE},<0.11\n' in _read(
        'requirements/mminstall.txt')
    assert "mminstall=read_requirements('mminstall.txt')" in setup_py
    assert "torch=read_requirements('torch.txt')" in setup_py
    assert mmstats.__version__ == '0.2.0'
    readme = _read('README.md')
    assert readme.count('\nSupported:') == 1, 'one "Supported:" paragraph'
    supported = ' '.join(
        readme.split('\nSupported:')[1].split('\n\n')[0].split())
    pinned = _read('requirements/constraints.txt').split('\ntorch==')[1].split(
        '\n')[0]
    for claim in ('Python 3.11', f'torch {MIN_TORCH}',
                  f'mmengine {MIN_MMENGINE}', f'torch {pinned}',
                  'Python >= 3.11', f'torch >= {MIN_TORCH}',
                  f'mmengine >= {MIN_MMENGINE}'):
        assert claim in supported, claim
    assert f'pip install {DIST_NAME}' in readme
    # this environment is one of the tested ones
    check_version('torch', torch.__version__, MIN_TORCH)
    check_version('mmengine', mmengine.__version__, MIN_MMENGINE)


@pytest.mark.parametrize('found,minimum,ok', [
    ('2.13.0+cpu', '2.1', True),
    ('2.1.2+cu121', '2.1', True),
    ('2.1.0a0+gitabc', '2.1', True),
    ('2.0.1', '2.1', False),
    ('1.13.1', '2.1', False),
    ('0.10.7', '0.10.7', True),
    ('0.10.6', '0.10.7', False),
    ('0.11.0', '0.10.7', True),
])
def test_old_versions_fail_at_import_naming_the_version(found, minimum, ok):
    if ok:
        check_version('torch', found, minimum)
    else:
        with pytest.raises(ImportError) as err:
            check_version('torch', found, minimum)
        assert f'needs torch >= {minimum} (found {found})' in str(err.value)
    assert release('2.11.0+cu130') == (2, 11, 0)


def import_mmstats_after(setup: str) -> subprocess.CompletedProcess:
    """``import mmstats`` in a new interpreter, after the line ``setup``."""
    return subprocess.run([sys.executable, '-c', f'{setup}\nimport mmstats\n'],
                          capture_output=True,
                          text=True,
                          cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def test_import_fails_with_an_old_torch(tmp_path):
    """``import mmstats`` under a torch that reports 2.0 fails first,
    naming 2.1."""
    proc = import_mmstats_after('import torch; torch.__version__ = "2.0.1"')
    assert proc.returncode != 0
    assert 'ImportError: mmstats needs torch >= 2.1 (found 2.0.1)' in \
        proc.stderr, proc.stderr


def test_a_missing_engine_names_both_distributions():
    proc = import_mmstats_after('import sys; sys.modules["mmengine"] = None')
    assert proc.returncode != 0
    assert ('ImportError: mmstats needs mmengine >= 0.10.7, which is not '
            'installed (mmstats never installs it itself)') in proc.stderr
    for name in ("'mmengine>=0.10.7,<0.11'", 'onedl-mmengine',
                 "'mmengine-stats[mminstall]'"):
        assert name in proc.stderr, name


def test_an_old_fork_is_named_as_the_fork(monkeypatch):
    import importlib.metadata
    monkeypatch.setattr(importlib.metadata, 'packages_distributions',
                        lambda: {'mmengine': ['onedl-mmengine']})
    with pytest.raises(
            ImportError,
            match=r'found 0\.9\.0 from '
            r'onedl-mmengine\): .*pip install onedl-mmengine'):
        check_version('mmengine', '0.9.0', MIN_MMENGINE)


CONFIG = """
custom_imports = dict(imports=['toy'], allow_failed_imports=False)
work_dir = 'work'
default_scope = None
model = dict(type='ToyBNModel')
_loader = dict(
    batch_size=8,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='ToyDataset', num_samples=32))
train_dataloader = _loader
val_dataloader = _loader
test_dataloader = _loader
val_evaluator = dict(type='ToyAccuracy')
test_evaluator = val_evaluator
test_cfg = dict()
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
train_cfg = dict(by_epoch=True, max_epochs=1, val_interval=1)
val_cfg = dict()
default_hooks = dict(logger=dict(type='LoggerHook', interval=2))
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=32, progress=False),
    dict(type='mmstats.StatsCollectorHook'),
]
randomness = dict(seed=0)
"""

TRAIN = """
import importlib.metadata
import json
import sys

from mmengine.config import Config
from mmengine.runner import Runner

runner = Runner.from_cfg(Config.fromfile(sys.argv[1]))
runner.train()
import mmstats

print('RESULT', json.dumps(dict(
    file=mmstats.__file__,
    version=importlib.metadata.version('mmengine-stats'),
    hooks=[type(h).__module__ + '.' + type(h).__name__ for h in runner.hooks],
    keys=sorted(runner.message_hub.log_scalars),
    sys_path=sys.path)))
"""


@pytest.mark.slow
def test_wheel_installs_and_trains_outside_the_checkout(tmp_path):
    pytest.importorskip('build', reason='pip install build (tests extra)')
    dist_dir = tmp_path / 'dist'
    build = subprocess.run([
        sys.executable, '-m', 'build', '--no-isolation', '--outdir',
        str(dist_dir), ROOT
    ],
                           capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    names = sorted(os.listdir(dist_dir))
    assert names == [
        'mmengine_stats-0.2.0-py3-none-any.whl', 'mmengine_stats-0.2.0.tar.gz'
    ]
    wheel = dist_dir / names[0]
    # pip never replaces the user's engine (upstream's or onedl-mmengine)
    # or torch: both only behind an extra
    import zipfile
    with zipfile.ZipFile(wheel) as whl:
        metadata = whl.read('mmengine_stats-0.2.0.dist-info/METADATA')
    requires = re.findall(r'^Requires-Dist: (.*)$', metadata.decode(), re.M)
    engine = [r for r in requires if re.match(r'(mmengine|torch)\b', r)]
    assert sorted(engine) == [
        'mmengine<0.11,>=0.10.7; extra == "mminstall"',
        f'torch>={MIN_TORCH}; extra == "torch"'
    ], requires

    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip',
                    str(venv)],
                   check=True)
    python = str(venv / 'bin' / 'python')
    code = 'import sysconfig; print(sysconfig.get_path("purelib"))'
    site = subprocess.run([python, '-c', code],
                          capture_output=True,
                          text=True,
                          check=True).stdout.strip()
    # torch, mmengine, numpy... from this environment, without its .pth
    # files (the editable install of this checkout)
    ours = sysconfig.get_path('purelib')
    with open(osp.join(site, 'zz_base_env.pth'), 'w') as f:
        f.write(ours + '\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith('PYTHON')}
    install = subprocess.run([
        sys.executable, '-m', 'pip', '--python', python, 'install',
        '--no-deps', '--no-index', '--no-cache-dir', '--quiet',
        str(wheel)
    ],
                             capture_output=True,
                             text=True,
                             env=env)
    assert install.returncode == 0, install.stdout + install.stderr

    run_dir = tmp_path / 'run'
    run_dir.mkdir()
    shutil.copy(osp.join(ROOT, 'tests', 'helpers', 'toy.py'), run_dir)
    (run_dir / 'config.py').write_text(CONFIG)
    (run_dir / 'train.py').write_text(textwrap.dedent(TRAIN))
    train = subprocess.run([python, 'train.py', 'config.py'],
                           capture_output=True,
                           text=True,
                           cwd=str(run_dir),
                           env=dict(env, OMP_NUM_THREADS='1'))
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-5000:]
    result = json.loads(
        re.search(r'^RESULT (.*)$', train.stdout, re.M).group(1))
    assert result['file'].startswith(site), result
    assert ROOT not in result['file']
    # the checkout's sources are not on the path (its .venv may be: torch
    # and mmengine come from there)
    sources = (ROOT, osp.join(ROOT, 'projects', 'digits_demo'))
    assert not any(p.rstrip(os.sep) in sources for p in result['sys_path'])
    assert result['version'] == '0.2.0'
    assert 'mmstats.hooks.precise_bn_hook.PreciseBNHook' in result['hooks']
    assert ('mmstats.hooks.stats_collector_hook.StatsCollectorHook'
            in result['hooks'])
    assert 'train/loss/mean' in result['keys']  # the text line's key

    # the installed launchers as users call them, on a real config and
    # checkpoint: `mmstats::` resolves to the wheel's fragments (the DDP
    # fragment's FlexibleRunner trains on one process, without the
    # pkg_resources warning); exit status 0, or 1 and one line
    (run_dir / 'ddp.py').write_text(
        "_base_ = ['config.py', 'mmstats::_base_/strategies/ddp.py']\n")
    bin_dir = venv / 'bin'

    def launch(*command):
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=str(run_dir),
            env=dict(env, OMP_NUM_THREADS='1'))

    trained = launch(str(bin_dir / 'mmstats-train'), 'ddp.py')
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr
    assert 'FlexibleRunner' in trained.stdout + trained.stderr
    assert 'pkg_resources' not in trained.stdout + trained.stderr
    assert re.search(r'^checkpoints: .*work', trained.stdout, re.M)
    # the curves of the run and the command that draws every figure
    assert re.search(
        r'^plots: +\S+/curves\.png \(every figure: '
        r'mmstats-plot \S+/work\)$', trained.stdout, re.M)
    checkpoint = str(run_dir / 'work' / 'epoch_1.pth')
    tested = launch(str(bin_dir / 'mmstats-test'), 'config.py', checkpoint)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr
    assert re.search(r'^test: accuracy=\d', tested.stdout, re.M)
    failed = launch(python, '-m', 'mmstats.tools.test', 'config.py',
                    'missing.pth')
    assert failed.returncode == 1
    assert failed.stderr.strip().splitlines() == [
        "mmstats-test: error: FileNotFoundError: checkpoint 'missing.pth' "
        'does not exist'
    ], failed.stderr
    # the figures and the converter are the wheel's too (mmstats-plot runs
    # in tests/test_tools/test_resumed_run.py)
    for script in ('mmstats-plot', 'mmstats-consolidate'):
        assert osp.isfile(bin_dir / script), script
    assert osp.isfile(osp.join(site, 'mmstats', 'analysis', 'runs.py'))
    fragment = osp.join(site, 'mmstats', '.mim', 'configs', '_base_',
                        'strategies', 'ddp.py')
    assert osp.isfile(fragment) and not osp.islink(fragment)
