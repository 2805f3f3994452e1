# The demo, iteration-based: validation and checkpoints every N iterations.
_base_ = [
    '../_base_/datasets/digits.py', '../_base_/models/resnet-mini.py',
    '../_base_/schedules/digits_iter.py', '../_base_/default_runtime.py'
]
# An endless sampler: IterBasedTrainLoop sleeps 2 s each time a finite
# loader runs out (mmengine's _InfiniteDataloaderIterator).
train_dataloader = dict(sampler=dict(type='InfiniteSampler', shuffle=True))
default_hooks = dict(
    checkpoint=dict(by_epoch=False, interval=100), logger=dict(interval=25))
log_processor = dict(by_epoch=False)
