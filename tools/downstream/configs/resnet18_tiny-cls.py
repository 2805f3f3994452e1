# mmpretrain's own ResNet-18 ImageNet config with Mixup (its
# resnet50_8xb32-mixup_in1k.py's batch augment) and EMAHook (as its
# configs add it), mmstats' four hooks on, on the tiny classification data
# of tools/downstream/make_data.py (data/tinycls/ under the working
# directory, mmpretrain's CustomDataset layout). What changes: 3 classes,
# 64x64 images cropped to 32, a few epochs. The stem and layer1 are frozen
# (frozen_stages=1: their BN layers in eval mode, left alone by precise BN);
# norm_eval=False, mmpretrain's default: the other BN layers train.
_base_ = ['mmpretrain::resnet/resnet18_8xb32_in1k.py']

custom_imports = dict(
    imports=['mmstats.launch.cpu_dist', 'downstream_recorder'],
    allow_failed_imports=False)

model = dict(
    backbone=dict(frozen_stages=1, norm_eval=False),
    head=dict(num_classes=3, topk=(1, )),
    train_cfg=dict(augments=dict(type='Mixup', alpha=0.2)))
data_preprocessor = dict(num_classes=3)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=32),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=36, edge='short'),
    dict(type='CenterCrop', crop_size=32),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=1,
    dataset=dict(
        _delete_=True,
        type='CustomDataset',
        data_root='data/tinycls',
        data_prefix='train',
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2,
    num_workers=1,
    dataset=dict(
        _delete_=True,
        type='CustomDataset',
        data_root='data/tinycls',
        data_prefix='val',
        pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

# a batch of 2, not mmpretrain's 8 x 32: its lr 0.1 made the loss climb (1.1
# to ~10 in 12 iterations) and, as the random seed fell, warn of a spike
optim_wrapper = dict(optimizer=dict(lr=0.01))
# one seed: the checks see the same run at every launch
randomness = dict(seed=0)

train_cfg = dict(max_epochs=2, val_interval=2)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=2))

modules = r'backbone\.layer\d|head\.fc'  # the neck (pooling) has no weights
custom_hooks = [
    dict(type='EMAHook', momentum=0.01, priority='ABOVE_NORMAL'),
    dict(type='mmstats.PreciseBNHook', num_samples=8, interval=1),
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('num', 'mean', 'std', 'min', 'max')),
    dict(type='mmstats.ModuleStatsHook', modules=modules),
    dict(type='mmstats.ThroughputHook', peak_flops=1e11),
    dict(type='DownstreamRecorderHook', modules=modules),
]
