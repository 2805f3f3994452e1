# mmseg's own PSPNet R-50-D8 Cityscapes config with mmstats' four hooks, on
# the tiny Cityscapes-layout data of tools/downstream/make_data.py
# (data/cityscapes/ under the working directory). What changes: SyncBN
# becomes BN (torch's SyncBatchNorm refuses CPU tensors), no pretrained
# weights, a small crop, a few iterations.
_base_ = ['mmseg::pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py']

custom_imports = dict(
    imports=['mmstats.launch.cpu_dist', 'downstream_recorder'],
    allow_failed_imports=False)

crop_size = (64, 128)
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(
        type='RandomResize',
        scale=(256, 128),
        ratio_range=(0.5, 2.0),
        keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=2, num_workers=1, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(num_workers=1, dataset=dict(pipeline=test_pipeline))

train_cfg = dict(max_iters=12, val_interval=12)
default_hooks = dict(logger=dict(interval=2), checkpoint=dict(interval=12))

# decode_head itself too: mmseg calls its forward as self.forward(inputs),
# which forward hooks do not see, so it gets norms but no act (and
# ModuleStatsHook says so once); its submodules are called as module(x)
modules = (r'backbone\.layer\d|decode_head(\.(psp_modules|bottleneck|'
           r'conv_seg))?|auxiliary_head\.convs')
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=8, interval=6),
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('num', 'mean', 'std', 'min', 'max')),
    dict(type='mmstats.ModuleStatsHook', modules=modules),
    dict(type='mmstats.ThroughputHook', peak_flops=1e11),
    dict(type='DownstreamRecorderHook', modules=modules),
]
