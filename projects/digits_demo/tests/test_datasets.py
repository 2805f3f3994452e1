import numpy as np
import pytest
from mmengine.dataset import default_collate

from digits_demo.datasets import (DigitsDataset, Normalize, PackInputs,
                                  RandomShift, SyntheticDigitsDataset)
from digits_demo.registry import DATASETS, TRANSFORMS


def test_digits_split_is_deterministic_disjoint_and_complete():
    train = DigitsDataset(split='train', val_fraction=0.2, split_seed=0)
    val = DigitsDataset(split='val', val_fraction=0.2, split_seed=0)
    assert (len(train), len(val)) == (1438, 359)
    train_idx = {train.get_data_info(i)['img_id'] for i in range(1438)}
    val_idx = {val.get_data_info(i)['img_id'] for i in range(359)}
    assert not train_idx & val_idx
    assert train_idx | val_idx == set(range(1797))
    again = DigitsDataset(split='val', val_fraction=0.2, split_seed=0)
    assert [again.get_data_info(i)['img_id'] for i in range(359)] == \
        [val.get_data_info(i)['img_id'] for i in range(359)]
    other = DigitsDataset(split='val', val_fraction=0.2, split_seed=1)
    assert {other.get_data_info(i)['img_id'] for i in range(359)} != val_idx


def test_digits_images_match_sklearn():
    from sklearn.datasets import load_digits
    digits = load_digits()
    data = DigitsDataset(split='all')
    info = data.get_data_info(17)
    np.testing.assert_allclose(info['img'], digits.images[17] / 16)
    assert info['gt_label'] == digits.target[17]
    assert data.metainfo['classes'] == tuple('0123456789')


def test_digits_read_from_the_csv_equal_sklearns(monkeypatch):
    """The file read without importing scikit-learn, and the fallback
    through ``load_digits`` where it is not found, give its arrays."""
    import importlib.util

    from sklearn.datasets import load_digits

    from digits_demo.datasets import digits as module
    want = load_digits()
    images, labels = module.load_digits_arrays()
    np.testing.assert_array_equal(images, want.images)
    np.testing.assert_array_equal(labels, want.target)
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
    images, labels = module.load_digits_arrays()
    np.testing.assert_array_equal(images, want.images)
    np.testing.assert_array_equal(labels, want.target)


def test_pipeline_packs_normalised_tensors():
    data = DigitsDataset(
        split='val',
        pipeline=[
            dict(type='digits_demo.Normalize', mean=0.5, std=0.25),
            dict(type='digits_demo.PackInputs')
        ])
    raw = DigitsDataset(split='val').get_data_info(3)
    sample = data[3]
    assert sample['inputs'].shape == (1, 8, 8)
    np.testing.assert_allclose(
        sample['inputs'][0].numpy(), (raw['img'] - 0.5) / 0.25, rtol=1e-6)
    assert int(sample['data_samples']['gt_label']) == raw['gt_label']
    batch = default_collate([data[0], data[1]])
    assert batch['inputs'].shape == (2, 1, 8, 8)
    assert batch['data_samples']['gt_label'].shape == (2, )


def test_random_shift_moves_content_by_at_most_max_shift():
    np.random.seed(0)
    img = np.zeros((8, 8), np.float32)
    img[3:5, 3:5] = 1
    shift = RandomShift(max_shift=1, prob=1.0)
    seen = set()
    for _ in range(50):
        out = shift.transform(dict(img=img.copy()))['img']
        ys, xs = np.nonzero(out)
        seen.add((ys.min() - 3, xs.min() - 3))
        assert out.sum() == 4  # nothing falls off an 8x8 image here
    assert seen <= {(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
    assert len(seen) > 3
    assert (RandomShift(prob=0.0).transform(dict(img=img))['img'] is img)


def test_synthetic_dataset_is_deterministic_and_learnable_format():
    a = SyntheticDigitsDataset(num_samples=50, split='all')
    b = SyntheticDigitsDataset(num_samples=50, split='all')
    assert len(a) == 50
    np.testing.assert_array_equal(
        a.get_data_info(7)['img'],
        b.get_data_info(7)['img'])
    labels = [a.get_data_info(i)['gt_label'] for i in range(50)]
    assert sorted(set(labels)) == list(range(10))


@pytest.mark.parametrize('kwargs, match', [
    (dict(split='tset'), 'split must be one of'),
    (dict(val_fraction=1.5), 'val_fraction must be in'),
])
def test_bad_dataset_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DATASETS.build(dict(type='DigitsDataset', **kwargs))
    with pytest.raises(ValueError, match=match):
        DATASETS.build(dict(type='SyntheticDigitsDataset', **kwargs))


def test_bad_transform_arguments_name_the_argument():
    with pytest.raises(ValueError, match='std must be > 0'):
        TRANSFORMS.build(dict(type='Normalize', std=0))
    with pytest.raises(ValueError, match='max_shift'):
        TRANSFORMS.build(dict(type='RandomShift', max_shift=-1))
    assert isinstance(TRANSFORMS.build(dict(type='PackInputs')), PackInputs)
    assert isinstance(TRANSFORMS.build(dict(type='Normalize')), Normalize)
