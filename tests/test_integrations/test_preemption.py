"""A run that stops costs at most one step, as a user launches it:
``bash tools/dist_train.sh`` on the demo's strategy configs (2 CPU gloo
processes) for DDP, FSDP2 (one file and sharded) and DeepSpeed ZeRO-3,
``max_keep_ckpts=1``, a checkpoint every epoch, 2 epochs.

For each, one chain of launches in one work dir, against an uninterrupted
run:

1. SIGKILL while epoch 2's checkpoint is written: epoch 1's stays, and
   ``last_checkpoint`` names it;
2. ``--resume``; SIGTERM to rank 1 only after iteration 18 (mid-epoch 2):
   every rank saves ``iter_18_preempted.pth``, the launch exits 75;
3. ``--resume``; SIGTERM to rank 1 only inside epoch 2's validation: every
   rank saves ``iter_24_preempted.pth``, exit 75;
4. ``--resume``: the interrupted validation runs again; the run ends.

Every launch's per-iteration all-rank losses equal the uninterrupted run's,
the final weights are bitwise the same, each validation logs the same
accuracy. 5 launches per strategy, ~4 min each on 2 busy cores:
``make test-preemption`` (not in ``make test`` nor ``.ci/run``).
"""
import glob
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from tests.helpers.launch import launch
from tests.test_integrations.test_checkpoints import (ROOT, STRATEGY_CFG,
                                                      full_weights,
                                                      logged_accuracy, records,
                                                      with_hook)

pytestmark = pytest.mark.preemption_matrix

CELLS = {
    'ddp': ('ddp', ()),
    'fsdp2': ('fsdp2', ()),
    'fsdp2_sharded': ('fsdp2', ('strategy.state_dict_cfg=sharded', )),
    'zero3': ('zero3', ()),
}
COMMON = ('train_cfg.max_epochs=2', 'default_hooks.logger.interval=1',
          'default_hooks.checkpoint.interval=1',
          'default_hooks.checkpoint.max_keep_ckpts=1')
HOOKS = 'tests.helpers.preempt'


class Cell:
    """A strategy's config, options and uninterrupted run."""

    def __init__(self, name, tmp):
        config, options = CELLS[name]
        self.name, self.tmp = name, tmp
        self.deepspeed = config == 'zero3'
        self.config = STRATEGY_CFG.format(config)
        self.options = (*COMMON, *options)
        self.full = str(tmp / 'full')

    def run(self, cfg, work_dir, *extra):
        """``dist_train.sh CFG 2`` in ``work_dir``."""
        return launch('dist_train.sh', [
            cfg, '2', '--work-dir', work_dir, *extra, '--cfg-options',
            *self.options
        ], self.deepspeed)

    def test(self, checkpoint, work_dir):
        """``dist_test.sh`` of ``checkpoint`` with the strategy."""
        return launch('dist_test.sh', [
            self.config, checkpoint, '2', '--work-dir', work_dir,
            '--cfg-options', *self.options
        ], self.deepspeed)

    def hooked(self, hook):
        return with_hook(self.tmp, self.config, HOOKS, hook)


@pytest.fixture(scope='module', params=list(CELLS))
def cell(request, tmp_path_factory):
    if request.param == 'zero3':
        pytest.importorskip('deepspeed')
    cell = Cell(request.param, tmp_path_factory.mktemp(request.param))
    first = cell.run(cell.config, cell.full)
    assert first.returncode == 0, first.stderr[-3000:]
    return cell


def test_kill_and_signals_then_resume_end_like_the_uninterrupted_run(cell):
    full, part = cell.full, str(cell.tmp / 'part')
    config, run, hooked = cell.config, cell.run, cell.hooked
    killed = run(hooked(dict(type='KillDuringSaveHook', epoch=2)), part)
    assert killed.returncode not in (0, 75), killed.stderr[-3000:]
    epoch_1 = osp.join(part, 'epoch_1.pth')
    assert not osp.exists(osp.join(part, 'epoch_2.pth'))
    with open(osp.join(part, 'last_checkpoint')) as f:
        assert f.read() == epoch_1
    mid = run(
        hooked(dict(type='SignalRankHook', at_iter=18)), part, '--resume')
    assert mid.returncode == 75, mid.stderr[-3000:]
    assert osp.exists(osp.join(part, 'iter_18_preempted.pth'))
    in_val = run(
        hooked(dict(type='SignalRankHook', in_val=1)), part, '--resume')
    assert in_val.returncode == 75, in_val.stderr[-3000:]
    saved = sorted(n for n in os.listdir(part) if n.endswith('.pth'))
    # epoch 2's complete checkpoint removed epoch 1's and iter 18's
    assert saved == ['epoch_2.pth', 'iter_24_preempted.pth'], saved
    last = run(config, part, '--resume')
    assert last.returncode == 0, last.stderr[-3000:]
    assert 'runs again' in last.stdout + last.stderr

    want = records(full)
    assert sorted(want) == list(range(1, 25))
    launches = glob.glob(osp.join(part, '*', 'vis_data', 'scalars.json'))
    assert len(launches) == 4
    for path in launches:  # every launch's records, each on its own
        with open(path) as f:
            for record in map(json.loads, f):
                if 'stats/loss/mean' in record:
                    assert record['stats/loss/mean'] == want[
                        record['step']]['stats/loss/mean'], (cell.name, path,
                                                             record)
    a = full_weights(osp.join(full, 'epoch_2.pth'))
    b = full_weights(osp.join(part, 'epoch_2.pth'))
    assert all(torch.equal(a[k], b[k]) for k in a), cell.name
    assert logged_accuracy(part) == logged_accuracy(full)


def _damage(cell, copy: str) -> str:
    """Damage ``copy`` the way its format breaks; the expected words."""
    if osp.isfile(copy):  # a file cut to half its size
        size = osp.getsize(copy) // 2
        with open(copy, 'r+b') as f:
            f.truncate(size)
        return (f'is cut short: {size:,} bytes, and the zip directory '
                'torch.save writes at its end is missing')
    name = ('__1_0.distcp' if not cell.deepspeed else
            'zero_pp_rank_1_mp_rank_00_optim_states.pt')
    os.remove(osp.join(copy, name))
    return f"lacks rank 1's {name}"


def test_a_damaged_checkpoint_is_refused_in_one_line(cell, tmp_path):
    """dist_test.sh on a damaged copy of epoch 1's checkpoint: exit 1, the
    last line names the path and what is wrong; a ZeRO-3 checkpoint
    resumed on one process names both numbers and the converter."""
    import shutil
    source = osp.join(cell.full, 'epoch_2.pth')  # max_keep_ckpts=1
    copy = str(tmp_path / 'epoch_2.pth')
    (shutil.copytree if osp.isdir(source) else shutil.copy)(source, copy)
    words = _damage(cell, copy)
    result = cell.test(copy, str(tmp_path / 'test'))
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f'tools/test.py: error: checkpoint {copy} {words}')
    if not cell.deepspeed:
        return
    work = str(tmp_path / 'resume')
    os.makedirs(work)
    shutil.copytree(source, osp.join(work, 'epoch_2.pth'))
    with open(osp.join(work, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(work, 'epoch_2.pth'))
    env = dict(os.environ, OMP_NUM_THREADS='1')
    env.pop('DS_ACCELERATOR', None)  # the launcher sets it
    one = subprocess.run([
        sys.executable,
        osp.join(ROOT, 'tools', 'train.py'), cell.config, '--work-dir', work,
        '--resume', '--cfg-options', *cell.options
    ],
                         cwd=ROOT,
                         env=env,
                         capture_output=True,
                         text=True,
                         timeout=300)
    assert one.returncode == 1, one.stderr[-3000:]
    last = one.stderr.strip().splitlines()[-1]
    assert last.startswith('tools/train.py: error: checkpoint '
                           f"{osp.join(work, 'epoch_2.pth')} is DeepSpeed's, "
                           'written by 2 processes, and this run has 1'), last
    assert 'consolidate_checkpoint.py' in last
