# mmdet's own Faster R-CNN R-50-FPN config with mmstats' four hooks, on the
# tiny COCO-format data of tools/downstream/make_data.py. mmdet's backbone
# settings stay: stage 1 frozen and norm_eval=True, so every BN layer is in
# eval mode and PreciseBNHook says once that it has nothing to recompute.
# What changes: the data (3 classes, a small image scale), no pretrained
# weights, fewer proposals and sampled RoIs (CPU time), a few epochs.
_base_ = ['mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py']

custom_imports = dict(
    imports=['mmstats.launch.cpu_dist', 'downstream_recorder'],
    allow_failed_imports=False)

classes = ('square', 'bar', 'blob')
scale = (256, 160)
model = dict(
    backbone=dict(init_cfg=None),
    roi_head=dict(bbox_head=dict(num_classes=len(classes))),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=200),
        rcnn=dict(sampler=dict(num=128))),
    # an untrained head's scores are low: keep its boxes for CocoMetric
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=200), rcnn=dict(score_thr=0.0)))

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

modules = r'backbone\.layer\d|neck|rpn_head|roi_head\.bbox_head'
custom_hooks = [
    dict(type='mmstats.PreciseBNHook', num_samples=8, interval=2),
    dict(
        type='mmstats.StatsCollectorHook',
        stats=('num', 'mean', 'std', 'min', 'max')),
    dict(type='mmstats.ModuleStatsHook', modules=modules),
    dict(type='mmstats.ThroughputHook', peak_flops=1e11),
    dict(type='DownstreamRecorderHook', modules=modules),
]
