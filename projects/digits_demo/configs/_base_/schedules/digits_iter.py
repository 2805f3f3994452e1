optim_wrapper = dict(
    optimizer=dict(
        type='SGD', lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=25),
    dict(
        type='CosineAnnealingLR',
        by_epoch=False,
        begin=25,
        T_max=325,
        eta_min=1e-3),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=350, val_interval=50)
val_cfg = dict()
test_cfg = dict()
