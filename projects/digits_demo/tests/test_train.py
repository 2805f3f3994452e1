"""Real mmengine Runners on the demo configs, tools/train.py end to end,
resume, and a 2-process gloo run through tools/dist_train.sh."""
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
from demo_utils import (EPOCH_CONFIG, ITER_CONFIG, MAIN_CONFIG, REPO, demo_env,
                        recording_config, run_train, small_cfg)
from mmengine.runner import Runner

from tests.helpers.dist import free_port
from tests.helpers.record_batches_hook import read_batches
from tests.test_integrations.test_tools_exit import load_tool


def test_the_tools_run_in_the_demos_environment():
    """The demo's tools run in subprocesses as ``make demo`` installs
    them: without DeepSpeed, whatever this environment has."""
    out = subprocess.run([sys.executable, '-c', 'import deepspeed'],
                         env=demo_env(),
                         capture_output=True,
                         text=True,
                         timeout=60)
    assert out.returncode != 0
    assert 'ModuleNotFoundError' in out.stderr, out.stderr


def test_epoch_config_trains_with_a_real_runner(tmp_path, clean_mmengine):
    cfg = small_cfg(EPOCH_CONFIG, tmp_path, train_cfg=dict(max_epochs=2))
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.epoch == 2 and runner.iter == 2 * 8  # 128 samples / 16
    assert osp.isfile(osp.join(tmp_path, 'epoch_2.pth'))
    acc = runner.message_hub.get_scalar('val/accuracy').current()
    assert 0 <= acc <= 100


def test_iter_config_trains_with_a_real_runner(tmp_path, clean_mmengine):
    cfg = small_cfg(
        ITER_CONFIG,
        tmp_path,
        train_cfg=dict(max_iters=12, val_interval=6),
        param_scheduler=[dict(type='ConstantLR', factor=1.0, by_epoch=False)],
        default_hooks=dict(checkpoint=dict(interval=6)))
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 12
    assert osp.isfile(osp.join(tmp_path, 'iter_12.pth'))
    assert runner.message_hub.get_scalar('val/accuracy').current() >= 0


def test_demo_reaches_95_percent_and_reports_paths(tmp_path):
    # the main job (`make demo`): both mmstats hooks on; 4 of its 15
    # epochs reach 98% (seed 0, one thread)
    out = run_train(MAIN_CONFIG, '--work-dir', str(tmp_path), '--cfg-options',
                    'train_cfg.max_epochs=4')
    assert out.returncode == 0, out.stderr[-3000:]
    line = re.search(r'^final validation: (.*)$', out.stdout, re.M).group(1)
    assert re.fullmatch(r'accuracy=[\d.]+', line), line  # metrics only
    assert float(line.split('=')[1]) >= 95.0
    for what in ('logs', 'scalars', 'checkpoints', 'plots'):
        path = re.search(rf'^{what}:\s+(\S+)', out.stdout, re.M).group(1)
        assert osp.exists(path), what
    # the curves, and the command that draws every figure of the run
    assert re.search(
        r'^plots: +\S+/curves\.png \(every figure: mmstats-plot '
        r'\S+\)$', out.stdout, re.M), out.stdout[-2000:]


def test_resume_continues_from_the_saved_epoch(tmp_path):
    args = [
        recording_config(tmp_path), '--work-dir',
        str(tmp_path), '--cfg-options',
        'train_dataloader.dataset.type=SyntheticDigitsDataset',
        'val_dataloader.dataset.type=SyntheticDigitsDataset',
        'default_hooks.checkpoint.interval=1'
    ]
    first = run_train(*args, 'train_cfg.max_epochs=2')
    assert first.returncode == 0, first.stderr[-3000:]
    assert osp.isfile(osp.join(tmp_path, 'epoch_2.pth'))
    os.remove(osp.join(tmp_path, 'batches_rank0.jsonl'))
    second = run_train(*args, 'train_cfg.max_epochs=3', '--resume')
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    assert 'resumed epoch: 2' in log
    epochs = {record['epoch'] for record in read_batches(tmp_path)}
    assert epochs == {2}  # only the third epoch (0-based 2) was trained
    assert osp.isfile(osp.join(tmp_path, 'epoch_3.pth'))
    # an explicit checkpoint path works too, and a missing one is an error
    third = run_train(*args, 'train_cfg.max_epochs=3', '--resume',
                      osp.join(tmp_path, 'epoch_2.pth'))
    assert third.returncode == 0, third.stderr[-3000:]
    # tools/test.py evaluates a checkpoint
    test = subprocess.run([
        sys.executable,
        osp.join(REPO, 'tools/test.py'), args[0],
        osp.join(tmp_path, 'epoch_3.pth'), '--work-dir',
        str(tmp_path), '--cfg-options', *args[4:6]
    ],
                          cwd=REPO,
                          env=demo_env(),
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert test.returncode == 0, test.stderr[-3000:]
    assert re.search(r'test: accuracy=\d+\.\d+', test.stdout)
    missing = run_train(*args, '--resume', osp.join(tmp_path, 'nope.pth'))
    assert missing.returncode != 0
    assert 'no such checkpoint file' in missing.stderr


def torchrun_ok(out: subprocess.CompletedProcess) -> None:
    """Every rank exited 0: torchrun exits 0 only then, and names a rank
    that died (an abort at exit: ``terminate called ...``, exitcode -6)."""
    log = out.stdout[-3000:] + out.stderr[-3000:]
    assert out.returncode == 0, log
    assert 'terminate called' not in out.stderr, log
    assert 'exitcode' not in out.stderr, log  # torchrun's failure summary


def test_two_gloo_processes_train_on_different_data(tmp_path):
    # no PYTHON=: the scripts use the repository's .venv by themselves
    # (a checkout without one, such as a git worktree: this interpreter)
    env = demo_env(
        dict(os.environ, PORT=str(free_port()), OMP_NUM_THREADS='1'))
    env.pop('PYTHON', None)
    if not osp.isfile(osp.join(REPO, '.venv', 'bin', 'python')):
        env['PYTHON'] = sys.executable
    out = subprocess.run([
        'bash',
        osp.join(REPO, 'tools/dist_train.sh'),
        recording_config(tmp_path), '2', '--work-dir',
        str(tmp_path), '--cfg-options', 'train_cfg.max_epochs=1'
    ],
                         cwd=REPO,
                         env=env,
                         capture_output=True,
                         text=True,
                         timeout=1200)  # slow under load, not a verdict
    torchrun_ok(out)
    assert 'final validation: accuracy=' in out.stdout
    ranks = [read_batches(tmp_path, rank) for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 12  # ceil(1438 / 2 / 64)
    seen = [{i for rec in batches for i in rec['idx']} for batches in ranks]
    assert not seen[0] & seen[1]
    assert len(seen[0] | seen[1]) == 1438
    env['PORT'] = str(free_port())
    out = subprocess.run([
        'bash',
        osp.join(REPO, 'tools/dist_test.sh'),
        recording_config(tmp_path),
        osp.join(tmp_path, 'epoch_1.pth'), '2', '--work-dir',
        str(tmp_path)
    ],
                         cwd=REPO,
                         env=env,
                         capture_output=True,
                         text=True,
                         timeout=1200)  # slow under load, not a verdict
    torchrun_ok(out)
    assert re.search(r'test: accuracy=\d+\.\d+', out.stdout)


@pytest.mark.parametrize('env_vars, expected, per_node', [
    (dict(GRES_GPUS='0'), None, '--ntasks-per-node=8'),
    (dict(GPUS_PER_NODE='0', GPUS='4'), None, None),
    (dict(), '--gres=gpu:8', '--ntasks-per-node=8'),
    (dict(GPUS_PER_NODE='2', GPUS='4'), '--gres=gpu:2', '--ntasks-per-node=2'),
])
def test_slurm_script_asks_for_gpus_only_on_gpu_partitions(
        tmp_path, env_vars, expected, per_node):
    fake = tmp_path / 'srun'
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f'{tmp_path}:{os.environ["PATH"]}', **env_vars)
    out = subprocess.run([
        'bash',
        osp.join(REPO, 'tools/slurm_train.sh'), 'cpu', 'job', EPOCH_CONFIG,
        str(tmp_path)
    ],
                         env=env,
                         capture_output=True,
                         text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    gres = [a for a in out.stdout.split() if a.startswith('--gres')]
    assert gres == ([expected] if expected else [])
    per_node_args = [
        a for a in out.stdout.split() if a.startswith('--ntasks-per-node')
    ]
    assert per_node_args == ([per_node] if per_node else [])
    assert f'--ntasks={env_vars.get("GPUS", "8")}' in out.stdout.split()
    assert '--launcher=slurm' in out.stdout


@pytest.mark.parametrize('args, message', [
    (['configs/nope.py'], 'does not exist'),
    ([EPOCH_CONFIG, '--cfg-options', 'train_dataloader.dataset.split=tset'
      ], 'split must be one of'),
    ([EPOCH_CONFIG, '--cfg-options', 'model.backbone.norm_cfg.type=Foo'
      ], "norm_cfg type 'Foo' is not a registered norm layer"),
])
@pytest.mark.runner  # tools/train.py's main builds it (not seen by conftest)
def test_bad_config_values_fail_clearly(tmp_path, args, message,
                                        clean_mmengine):
    # tools/train.py's main in this process: the error it ends with (the
    # subprocesses above show that an error ends the process non-zero)
    train = load_tool('train')
    with pytest.raises(Exception, match=re.escape(message)):
        train.main([*args, '--work-dir', str(tmp_path)])
