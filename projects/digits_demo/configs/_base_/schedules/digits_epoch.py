optim_wrapper = dict(
    optimizer=dict(
        type='SGD', lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True))
param_scheduler = [
    # warm up over the first 20 iterations, then cosine over the epochs
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=20),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        T_max=15,
        eta_min=1e-3,
        convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=15, val_interval=1)
val_cfg = dict()
test_cfg = dict()
