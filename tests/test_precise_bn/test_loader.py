"""The loader a recomputation reads (``precise_bn/loader.py``) without a
Runner: built like the training loader, with its own shuffled sampler, or
from a config the way ``Runner.build_dataloader`` builds one."""
import pytest
import torch
from mmengine.dataset import DefaultSampler
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from mmstats.precise_bn import check_loader_cfg, loader_from_cfg, loader_like

OWNER = 'PreciseBNHook'


class NoIterLoader(DataLoader):
    """A training loader whose stream must never be started."""

    def __iter__(self):
        raise AssertionError('the training loader was iterated')


def _collate(batch):
    return torch.tensor(batch)


def _init_worker(worker_id):
    pass


@pytest.mark.parametrize('drop_last', [False, True])
def test_loader_like_takes_the_training_loaders_settings(drop_last):
    train = NoIterLoader(
        list(range(10)),
        batch_size=4,
        shuffle=False,
        num_workers=2,
        collate_fn=_collate,
        pin_memory=False,
        worker_init_fn=_init_worker,
        drop_last=drop_last)
    loader = loader_like(train, 7, OWNER)
    assert loader is not train and loader.dataset is train.dataset
    assert loader.batch_size == 4 and loader.drop_last is drop_last
    assert loader.num_workers == 2 and loader.persistent_workers
    assert loader.collate_fn is _collate
    assert loader.worker_init_fn is _init_worker
    assert loader.pin_memory is False
    assert len(loader) == (2 if drop_last else 3)


def test_loader_like_samples_with_its_own_shuffled_seeded_sampler():
    train = NoIterLoader(list(range(20)), batch_size=5)  # not shuffled
    loader = loader_like(train, 3, OWNER)
    assert isinstance(loader.sampler, DefaultSampler)
    assert loader.sampler.shuffle and loader.sampler.seed == 3
    for epoch in (0, 1):  # set_epoch chooses each run's samples
        loader.sampler.set_epoch(epoch)
        reference = DefaultSampler(train.dataset, shuffle=True, seed=3)
        reference.set_epoch(epoch)
        assert torch.cat(list(loader)).tolist() == list(reference)
    assert not loader.persistent_workers  # no workers


def test_loader_like_reads_a_batch_sampler():
    """A training loader built with ``batch_sampler=``: its batch size and
    its ``drop_last``."""
    dataset = list(range(10))
    train = NoIterLoader(
        dataset,
        batch_sampler=BatchSampler(
            SequentialSampler(dataset), batch_size=3, drop_last=True))
    assert train.batch_size is None and not train.drop_last
    loader = loader_like(train, 0, OWNER)
    assert loader.batch_size == 3 and loader.drop_last
    assert [len(b) for b in loader] == [3, 3, 3]


def test_loader_like_refuses_a_loader_without_batch_size():
    train = DataLoader(list(range(4)), batch_size=None)
    with pytest.raises(
            ValueError,
            match='PreciseBNHook cannot tell the batch size.*'
            r'dataloader=dict\(\.\.\.\)'):
        loader_like(train, 0, OWNER)


@pytest.mark.parametrize('cfg', [
    None,
    dict(batch_size=2, dataset=[], sampler=dict(type='DefaultSampler')),
    dict(batch_sampler=dict(type='X'), dataset=[], sampler=dict()),
])
def test_complete_loader_configs_pass(cfg):
    check_loader_cfg(cfg, OWNER)


@pytest.mark.parametrize('cfg, error, match', [
    ([1], TypeError, 'PreciseBNHook: dataloader must be None or a .* got '
     'list'),
    (dict(batch_size=4), ValueError,
     r"PreciseBNHook: dataloader lacks \['dataset', 'sampler'\] \(got keys "
     r"\['batch_size'\]\).*dataloader=None"),
    (dict(dataset=[],
          sampler={}), ValueError, r"dataloader lacks \['batch_size'\]"),
])
def test_incomplete_loader_configs_are_refused(cfg, error, match):
    with pytest.raises(error, match=match):
        check_loader_cfg(cfg, OWNER)


def test_loader_from_cfg_builds_a_copy_with_persistent_workers():
    calls = []

    def build(cfg, seed):
        calls.append((cfg, seed))
        return 'loader'

    cfg = dict(batch_size=4, dataset=dict(type='D'), sampler={}, num_workers=2)
    assert loader_from_cfg(cfg, 5, build, OWNER) == 'loader'
    built, seed = calls[0]
    assert seed == 5 and built['persistent_workers'] is True
    assert 'persistent_workers' not in cfg  # the caller's config stays
    built['dataset']['type'] = 'changed'  # a deep copy
    assert cfg['dataset'] == dict(type='D')
    # no workers: none to keep; an explicit choice is kept
    loader_from_cfg(dict(cfg, num_workers=0), 5, build, OWNER)
    loader_from_cfg(dict(cfg, persistent_workers=False), 5, build, OWNER)
    assert [c['persistent_workers'] for c, _ in calls[1:]] == [False, False]


def test_loader_from_cfg_names_the_config_and_the_cause():

    def build(cfg, seed):
        raise KeyError('NoSuchDataset is not in the dataset registry')

    cfg = dict(batch_size=4, dataset=dict(type='NoSuchDataset'), sampler={})
    with pytest.raises(
            ValueError,
            match=r"PreciseBNHook: could not build its dataloader from "
            r"dataloader=\{'batch_size': 4.*NoSuchDataset.*"
            'dataloader=None') as info:
        loader_from_cfg(cfg, 0, build, OWNER)
    assert isinstance(info.value.__cause__, KeyError)


def test_loader_from_cfg_with_the_runners_builder():
    """What the hook passes: mmengine's ``Runner.build_dataloader``."""
    from mmengine.runner import Runner
    cfg = dict(
        batch_size=3,
        dataset=list(range(9)),
        sampler=dict(type='DefaultSampler', shuffle=True, seed=1))
    loader = loader_from_cfg(cfg, 1, Runner.build_dataloader, OWNER)
    assert isinstance(loader.sampler, DefaultSampler)
    assert loader.batch_size == 3 and not loader.persistent_workers
    # pseudo_collate, the runner's default: batches are lists
    assert sorted(i for batch in loader for i in batch) == list(range(9))
