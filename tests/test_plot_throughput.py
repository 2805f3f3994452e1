"""tools/analysis/plot_throughput.py on written scalars.json files."""
import json
import os.path as osp
import sys

import pytest

matplotlib = pytest.importorskip('matplotlib')
matplotlib.use('Agg')

sys.path.insert(
    0, osp.join(osp.dirname(osp.dirname(__file__)), 'tools', 'analysis'))
import plot_throughput  # noqa: E402


def _write(path, records):
    with open(path, 'w') as f:
        for record in records:
            f.write(json.dumps(record) + '\n')


def test_png_with_mfu_and_the_ranks_of_the_peaks(tmp_path):
    path = str(tmp_path / 'scalars.json')
    _write(path, [{
        'step': step,
        'throughput/samples_per_s': 100.0 + step,
        'throughput/mfu': 0.4,
        'memory/max_allocated': 1000.0 + step,
        'memory/max_allocated_rank': step % 2,
        'memory/max_reserved': 2000.0,
        'memory/max_reserved_rank': 0,
    } for step in (10, 20, 30)] + [{
        'step': 30,
        'loss': 1.0
    }])
    out = plot_throughput.plot_throughput(path)
    assert out == str(tmp_path / 'throughput.png') and osp.getsize(out) > 0


def test_nothing_without_the_hook_keys(tmp_path):
    path = str(tmp_path / 'scalars.json')
    _write(path, [{'step': 1, 'loss': 1.0}])
    assert plot_throughput.plot_throughput(path) is None
