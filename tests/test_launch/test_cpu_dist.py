"""``custom_imports=dict(imports=['mmstats.launch.cpu_dist'])``: another
package's ``tools/train.py`` on 2 CPU processes under a real torchrun."""
import json
import os
import os.path as osp
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import FlexibleRunner, Runner

from mmstats.launch import cpu_dist, setup_launcher
from mmstats.launch.setup import no_buffer_sync_kwargs
from tests.helpers.dist import free_port, run_distributed
from tests.helpers.runner import toy_cfg
from tests.helpers.without_deepspeed import env_without_deepspeed

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
FOREIGN_TRAIN = osp.join(ROOT, 'tests', 'test_integrations',
                         'foreign_train.py')


@pytest.fixture
def no_cpu_dist():
    """mmengine's own ``Runner.from_cfg`` during the test and after it."""
    was = cpu_dist.is_installed()
    cpu_dist.uninstall()
    original = Runner.__dict__['from_cfg']
    yield original
    cpu_dist.uninstall()
    assert Runner.__dict__['from_cfg'].__func__ is original.__func__
    if was:
        cpu_dist.install()


@pytest.mark.parametrize('env, cuda', [({}, False), ({
    'WORLD_SIZE': '2'
}, True)])
def test_import_changes_nothing_without_a_launcher_or_with_cuda(
        monkeypatch, no_cpu_dist, env, cuda):
    for key in cpu_dist.LAUNCHER_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: cuda)
    assert cpu_dist.install() is False
    assert Runner.__dict__['from_cfg'] is no_cpu_dist


@pytest.mark.parametrize('var', cpu_dist.LAUNCHER_ENV)
def test_under_a_launcher_from_cfg_with_launcher_none_is_unchanged(
        tmp_path, monkeypatch, no_cpu_dist, clean_mmengine, var):
    monkeypatch.setenv(var, '0')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    assert cpu_dist.install() is True
    assert cpu_dist.install() is True  # idempotent: wrapped once
    assert Runner.from_cfg.__func__.__wrapped__ is no_cpu_dist.__func__
    # what RUNNERS.build calls for runner_type='FlexibleRunner'
    assert FlexibleRunner.from_cfg.__func__.__wrapped__.__qualname__ == \
        'FlexibleRunner.from_cfg'
    cfg = toy_cfg(tmp_path)
    cfg.launcher = 'none'
    runner = Runner.from_cfg(cfg)
    assert not torch.distributed.is_initialized()
    assert not runner.distributed
    assert 'model_wrapper_cfg' not in cfg


def test_setup_launcher_uses_mmengines_default_wrapper_settings(monkeypatch):
    """On CPU: mmengine's default DDP wrapper (no buffer sync in forward,
    the config's find_unused_parameters) with device_ids=None."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.distributed, 'is_initialized', lambda: True)
    cfg = dict(launcher='pytorch', find_unused_parameters=True)
    setup_launcher(cfg)
    assert cfg['model_wrapper_cfg'] == dict(
        type='MMDistributedDataParallel',
        device_ids=None,
        **no_buffer_sync_kwargs(),
        find_unused_parameters=True)
    assert cfg['env_cfg']['dist_cfg']['backend'] == 'gloo'
    own = dict(launcher='pytorch', model_wrapper_cfg=dict(type='X'))
    setup_launcher(own)
    assert own['model_wrapper_cfg'] == dict(type='X')  # the user's wins


def _wrap_with_the_launcher_cfg(rank, world_size):
    torch.cuda.is_available = lambda: False  # the CPU path, on any machine
    cfg = dict(launcher='pytorch')
    setup_launcher(cfg)  # the process group exists: only the config
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        ddp = MODEL_WRAPPERS.build(
            dict(cfg['model_wrapper_cfg'], module=model))
    ddp(torch.full((4, 2), float(rank)) + torch.arange(4.)[:, None])
    return ([
        str(w.message) for w in caught if issubclass(w.category, FutureWarning)
    ], ddp.broadcast_buffers, model[1].running_mean.tolist())


def test_launcher_wrapper_cfg_warns_nothing_and_syncs_no_buffers():
    """torch 2.13 deprecates DDP's ``broadcast_buffers`` with a
    FutureWarning per rank: the launcher's wrapper config must not cause it
    (nor any other FutureWarning), and buffers still stay each rank's own
    in training (mmengine's default): rank-dependent inputs give different
    BN running means."""
    results = run_distributed(_wrap_with_the_launcher_cfg, 2)
    for deprecations, broadcast, _ in results:
        assert deprecations == []
        assert broadcast is False
    assert results[0][2] != results[1][2]


def test_foreign_train_script_on_two_cpu_processes(tmp_path):
    """A miniature of mmpretrain's tools/train.py under torchrun: the
    config's custom_imports is the only change. Every rank's losses reach
    StatsCollectorHook's published statistics."""
    if torch.cuda.is_available():
        pytest.skip('the CPU path: with CUDA mmengine launches by itself')
    cfg = toy_cfg(
        tmp_path / 'work',
        num_samples=96,
        batch_size=8,
        max_epochs=1,
        log_interval=3)
    cfg.custom_imports = dict(
        imports=['tests.helpers.toy', 'mmstats.launch.cpu_dist'])
    cfg.custom_hooks = [
        dict(type='mmstats.StatsCollectorHook', stats=('num', 'mean')),
        dict(type='ForeignLossRecorderHook')
    ]
    config = str(tmp_path / 'foreign_cfg.py')
    cfg.dump(config)
    env = env_without_deepspeed(  # 2.7 s of CPU per rank spared
        dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [ROOT, os.environ.get('PYTHONPATH', '')]),
            OMP_NUM_THREADS='1'))
    for key in cpu_dist.LAUNCHER_ENV + ('RANK', 'LOCAL_RANK', 'MASTER_PORT'):
        env.pop(key, None)
    proc = subprocess.run([
        sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
        '--master_port',
        str(free_port()), FOREIGN_TRAIN, config, '--launcher', 'pytorch'
    ],
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [
        json.load(open(tmp_path / 'work' / f'rank{r}.json')) for r in range(2)
    ]
    for rec in ranks:
        assert rec['world_size'] == 2
        assert rec['wrapper'] == 'MMDistributedDataParallel'
        assert rec['device_ids'] is None
        assert rec['broadcast_buffers'] is False
        assert len(rec['losses']) == 6  # 96 samples / 2 ranks / 8
    losses = np.array([rec['losses'] for rec in ranks])  # rank x iteration
    scalars = {}
    with open(osp.join(ranks[0]['log_dir'], 'vis_data', 'scalars.json')) as f:
        for line in f:
            record = json.loads(line)
            scalars.setdefault(record['step'], {}).update(record)
    steps = sorted(s for s, r in scalars.items() if 'stats/loss/num' in r)
    assert steps == [3, 6]
    for start, step in ((0, 3), (3, 6)):
        window = losses[:, start:step]
        assert scalars[step]['stats/loss/num'] == window.size
        np.testing.assert_allclose(
            scalars[step]['stats/loss/mean'], window.mean(), rtol=1e-6)
