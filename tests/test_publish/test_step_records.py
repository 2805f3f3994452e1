"""StepRecordJoiner: one scalars.json line per step, nothing merged away,
nothing held back, LoggerHook's own file as it was."""
import json
import os.path as osp

from mmengine.visualization import LocalVisBackend

from mmstats.publish.step_records import (LOOK_BACK, StepRecordJoiner,
                                          join_step_records)


def _lines(path):
    return [json.loads(line) for line in open(path)]


def _joiner(tmp_path):
    backend = LocalVisBackend(str(tmp_path))
    return StepRecordJoiner(backend), backend


def test_same_step_joins_and_is_written_at_once(tmp_path):
    joiner, backend = _joiner(tmp_path)
    joiner.add_scalars({'stats/loss/mean': 2.0}, step=10)
    path = backend._scalar_save_file
    assert _lines(path) == [{'stats/loss/mean': 2.0, 'step': 10}]  # now
    joiner.add_scalars({'loss': 2.5}, step=10, file_path='run.json')
    assert _lines(path) == [{'stats/loss/mean': 2.0, 'step': 10, 'loss': 2.5}]
    # LoggerHook's own file gets its record only
    assert _lines(osp.join(str(tmp_path), 'run.json')) == [{
        'loss': 2.5,
        'step': 10
    }]


def test_a_conflicting_value_is_never_merged_away(tmp_path):
    joiner, backend = _joiner(tmp_path)
    joiner.add_scalars({'x': 1.0}, step=3)
    joiner.add_scalars({'x': 2.0}, step=3)
    assert _lines(backend._scalar_save_file) == [{
        'x': 1.0,
        'step': 3
    }, {
        'x': 2.0,
        'step': 3
    }]


def test_joins_across_a_smaller_step_not_a_larger_one(tmp_path):
    """A validation record at epoch 2 between iteration 20's records: 20
    still joins; iteration 2's record never joins epoch 2's metrics once
    larger steps came after it."""
    joiner, backend = _joiner(tmp_path)
    joiner.add_scalars({'loss': 1.0}, step=2)
    joiner.add_scalars({'loss': 0.9}, step=20)
    joiner.add_scalars({'accuracy': 50.0}, step=2)  # the epoch
    joiner.add_scalars({'precise_bn/var_change': 0.1}, step=20)
    assert [(r['step'], sorted(r)) for r in _lines(backend._scalar_save_file)
            ] == [(2, ['loss', 'step']),
                  (20, ['loss', 'precise_bn/var_change', 'step']),
                  (2, ['accuracy', 'step'])]


def test_another_writer_makes_it_append(tmp_path):
    joiner, backend = _joiner(tmp_path)
    joiner.add_scalars({'a': 1}, step=1)
    with open(backend._scalar_save_file, 'a') as f:
        f.write(json.dumps({'b': 2, 'step': 1}) + '\n')
    joiner.add_scalars({'c': 3}, step=1)
    assert len(_lines(backend._scalar_save_file)) == 3


def test_look_back_is_bounded(tmp_path):
    joiner, backend = _joiner(tmp_path)
    joiner.add_scalars({'a': 1}, step=100)
    for step in range(LOOK_BACK):
        joiner.add_scalars({'a': 1}, step=step)
    joiner.add_scalars({'b': 1}, step=100)  # out of reach now
    assert len(_lines(backend._scalar_save_file)) == LOOK_BACK + 2


def test_installed_once_per_backend(tmp_path):
    from types import SimpleNamespace
    backend = LocalVisBackend(str(tmp_path))
    visualizer = SimpleNamespace(_vis_backends={'local': backend})
    assert join_step_records(visualizer) == 1
    installed = backend.add_scalars
    assert join_step_records(visualizer) == 1
    assert backend.add_scalars == installed
    backend.add_scalars({'a': 1}, step=1)
    backend.add_scalars({'b': 2}, step=1)
    assert _lines(backend._scalar_save_file) == [{'a': 1, 'step': 1, 'b': 2}]
