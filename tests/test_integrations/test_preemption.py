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

import pytest
import torch

from tests.helpers.launch import launch
from tests.test_integrations.test_checkpoints import (STRATEGY_CFG,
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


@pytest.mark.parametrize('cell', list(CELLS))
def test_kill_and_signals_then_resume_end_like_the_uninterrupted_run(
        tmp_path, cell):
    name, options = CELLS[cell]
    deepspeed = name == 'zero3'
    if deepspeed:
        pytest.importorskip('deepspeed')
    config = STRATEGY_CFG.format(name)
    options = (*COMMON, *options)
    full, part = str(tmp_path / 'full'), str(tmp_path / 'part')

    def run(cfg, work_dir, *extra):
        return launch('dist_train.sh', [
            cfg, '2', '--work-dir', work_dir, *extra, '--cfg-options', *options
        ], deepspeed)

    def hooked(hook):
        return with_hook(tmp_path, config, HOOKS, hook)

    first = run(config, full)
    assert first.returncode == 0, first.stderr[-3000:]
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
                        record['step']]['stats/loss/mean'], (cell, path,
                                                             record)
    a = full_weights(osp.join(full, 'epoch_2.pth'))
    b = full_weights(osp.join(part, 'epoch_2.pth'))
    assert all(torch.equal(a[k], b[k]) for k in a), cell
    assert logged_accuracy(part) == logged_accuracy(full)
