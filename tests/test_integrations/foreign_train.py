"""Another package's ``tools/train.py`` in miniature (what mmpretrain's,
mmdet's and mmseg's do: load the config, set ``cfg.launcher``,
``Runner.from_cfg``, train), plus a per-rank record for the test.

    torchrun --nproc_per_node 2 foreign_train.py CONFIG --launcher pytorch
"""
import argparse
import json
import os.path as osp

from mmengine.config import Config
from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner


@HOOKS.register_module(force=True)
class ForeignLossRecorderHook(Hook):
    """Every training loss of this rank."""

    def __init__(self) -> None:
        self.losses = []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.losses.append(float(outputs['loss'].detach()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('config')
    parser.add_argument('--launcher', default='none')
    args = parser.parse_args()
    cfg = Config.fromfile(args.config)  # imports cfg.custom_imports
    cfg.launcher = args.launcher
    runner = Runner.from_cfg(cfg)
    runner.train()
    recorder = [
        h for h in runner.hooks if isinstance(h, ForeignLossRecorderHook)
    ][0]
    model = runner.model
    record = dict(
        world_size=get_world_size(),
        wrapper=type(model).__name__,
        device_ids=getattr(model, 'device_ids', 'absent'),
        broadcast_buffers=getattr(model, 'broadcast_buffers', 'absent'),
        log_dir=runner.log_dir,
        losses=recorder.losses)
    with open(osp.join(cfg.work_dir, f'rank{get_rank()}.json'), 'w') as f:
        json.dump(record, f)


if __name__ == '__main__':
    main()
