norm_cfg = dict(
    type='BN')  # or dict(type='GN', num_groups=8), dict(type='SyncBN')
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='ResNetMini',
        in_channels=1,
        stem_channels=32,
        stage_channels=(32, 64),
        blocks_per_stage=1,
        norm_cfg=norm_cfg),
    num_classes=10,
    data_preprocessor=dict(type='TensorDataPreprocessor'))
