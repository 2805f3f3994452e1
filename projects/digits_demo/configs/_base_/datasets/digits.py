# scikit-learn's handwritten digits, embedded in the package: no download.
dataset_type = 'DigitsDataset'
split_cfg = dict(val_fraction=0.2, split_seed=0)  # deterministic split

train_pipeline = [
    dict(type='RandomShift', max_shift=1, prob=0.5),
    dict(type='Normalize', mean=0.305, std=0.376),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='Normalize', mean=0.305, std=0.376),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=64,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type=dataset_type, split='train', pipeline=train_pipeline,
        **split_cfg))
val_dataloader = dict(
    batch_size=128,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type=dataset_type, split='val', pipeline=test_pipeline, **split_cfg))
val_evaluator = dict(type='Accuracy')
test_dataloader = val_dataloader
test_evaluator = val_evaluator
