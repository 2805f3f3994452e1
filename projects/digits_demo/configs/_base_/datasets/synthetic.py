# A tiny synthetic digits-like dataset for fast tests and smoke runs.
_base_ = ['./digits.py']
dataset_type = 'SyntheticDigitsDataset'
train_dataloader = dict(
    batch_size=16, dataset=dict(type=dataset_type, num_samples=160))
val_dataloader = dict(
    batch_size=32, dataset=dict(type=dataset_type, num_samples=160))
test_dataloader = val_dataloader
