"""A test-only hook that records which samples each rank trains on.

Import it with
``custom_imports=dict(imports=['tests.helpers.record_batches_hook'])``.
"""
import json
import os.path as osp

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class RecordBatchesHook(Hook):
    """Append each training batch's sample indices and input checksum to
    ``{work_dir}/batches_rank{rank}.jsonl``."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        samples = data_batch['data_samples']
        record = dict(
            iter=runner.iter,
            epoch=runner.epoch,
            idx=samples['img_id'].tolist(),
            checksum=float(data_batch['inputs'].double().sum()))
        path = osp.join(runner.work_dir, f'batches_rank{get_rank()}.jsonl')
        with open(path, 'a') as f:
            f.write(json.dumps(record) + '\n')


def read_batches(work_dir: str, rank: int = 0) -> list:
    with open(osp.join(work_dir, f'batches_rank{rank}.jsonl')) as f:
        return [json.loads(line) for line in f]
