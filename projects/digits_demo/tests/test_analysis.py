"""tools/analysis scripts on real runs: they produce their PNGs."""
import os.path as osp
import re
import subprocess
import sys

import pytest
from demo_utils import ITER_CONFIG, REPO, demo_env, small_cfg
from mmengine.runner import Runner

sys.path.insert(0, osp.join(REPO, 'tools', 'analysis'))
import plot_stats  # noqa: E402


def test_plot_stats_draws_reported_statistics(tmp_path, clean_mmengine):
    cfg = small_cfg(
        ITER_CONFIG,
        tmp_path,
        train_cfg=dict(max_iters=6, val_interval=100),
        param_scheduler=[dict(type='ConstantLR', factor=1.0, by_epoch=False)])
    cfg.model.report_stats = True
    cfg.custom_hooks = [dict(type='mmstats.StatsCollectorHook')]
    Runner.from_cfg(cfg).train()
    out = str(tmp_path / 'stats.png')
    assert plot_stats.main(
        [str(tmp_path), '--keys', 'loss', 'model/feat_norm', '--out',
         out]) == out
    assert osp.getsize(out) > 10_000
    with pytest.raises(SystemExit, match=r"available: \[.*'loss', 'model/"):
        plot_stats.main([str(tmp_path), '--keys', 'nope'])


def test_precise_bn_vs_ema_reports_both_runs(tmp_path):
    out = str(tmp_path / 'cmp.png')
    proc = subprocess.run([
        sys.executable,
        osp.join(REPO, 'projects/digits_demo/tools/precise_bn_vs_ema.py'),
        '--epochs', '2', '--num-samples', '256', '--work-dir',
        str(tmp_path), '--out', out
    ],
                          cwd=REPO,
                          env=demo_env(),
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r'^\s+(\d+)\s+([\d.]+)\s+([\d.]+)$', proc.stdout, re.M)
    assert [r[0] for r in rows] == ['1', '2']
    assert all(0 <= float(v) <= 100 for r in rows for v in r[1:])
    assert osp.getsize(out) > 10_000
