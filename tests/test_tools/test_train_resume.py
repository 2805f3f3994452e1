"""What ``tools/train.py --resume`` takes (``mmstats.tools.train``), and the
checkpoint hook the launchers build: no training, the config only."""
import os.path as osp

import torch

from mmstats.tools import train
from mmstats.tools.launcher import use_safe_checkpoints

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(ROOT, 'projects', 'digits_demo', 'configs', 'demo',
                  'resnet-mini_1xb64-precise-bn-stats_digits.py')


def _resume(work_dir):
    return train.build_config(
        train.parse_args([CONFIG, '--work-dir', work_dir, '--resume']))


def test_resume_names_the_newest_complete_checkpoint_it_takes(
        tmp_path, capsys):
    work = str(tmp_path)
    cfg = _resume(work)
    assert (cfg.resume, cfg.load_from) == (False, None)
    assert 'training from scratch' in capsys.readouterr().err
    first = osp.join(work, 'epoch_1.pth')
    torch.save({'meta': {}}, first)
    with open(osp.join(work, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(work, 'epoch_2.pth'))  # removed, or never written
    cfg = _resume(work)
    assert (cfg.resume, cfg.load_from) == (True, first)
    assert capsys.readouterr().err.strip() == (
        f"tools/train.py: --resume: last_checkpoint names "
        f"{osp.join(work, 'epoch_2.pth')}, which does not exist: resuming "
        f'the newest complete checkpoint, {first}')


def test_the_launchers_swap_in_mmstats_checkpoint_hook():
    cfg = dict(
        default_hooks=dict(
            checkpoint=dict(
                type='CheckpointHook', interval=1, max_keep_ckpts=1)))
    use_safe_checkpoints(cfg)
    assert cfg['default_hooks']['checkpoint'] == dict(
        type='mmstats.CheckpointHook', interval=1, max_keep_ckpts=1)
    own = dict(default_hooks=dict(checkpoint=dict(type='MyCheckpointHook')))
    use_safe_checkpoints(own)
    assert own['default_hooks']['checkpoint']['type'] == 'MyCheckpointHook'
