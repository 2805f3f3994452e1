# mmdet's own RetinaNet R-50-FPN config with mmstats' four hooks, on the
# tiny COCO-format data of tools/downstream/make_data.py (data/coco/ under
# the working directory). What changes from mmdet's config: the data (3
# classes, a small image scale), no pretrained weights, a few epochs, and
# norm_eval=False so that the BN layers of stages 2-4 train (the stem and
# stage 1 stay frozen, in eval mode) and PreciseBNHook has layers to
# recompute.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py']

custom_imports = dict(
    imports=['mmstats.launch.cpu_dist', 'downstream_recorder'],
    allow_failed_imports=False)

classes = ('square', 'bar', 'blob')
scale = (256, 160)
model = dict(
    backbone=dict(init_cfg=None, norm_eval=False),
    bbox_head=dict(num_classes=len(classes)),
    # an untrained head scores ~0.01: keep its boxes for CocoMetric
    test_cfg=dict(score_thr=0.0))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=scale, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(
    batch_size=2,
    num_workers=1,
    dataset=dict(metainfo=dict(classes=classes), pipeline=train_pipeline))
val_dataloader = dict(
    num_workers=1,
    dataset=dict(metainfo=dict(classes=classes), pipeline=test_pipeline))

train_cfg = dict(max_epochs=4, val_interval=4)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=4))

modules = r'backbone\.layer\d|neck|bbox_head'
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=8, interval=2),
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('num', 'mean', 'std', 'min', 'max')),
    dict(type='mmstats.ModuleStatsHook', modules=modules),
    dict(type='mmstats.ThroughputHook', peak_flops=1e11),
    dict(type='DownstreamRecorderHook', modules=modules),
]
