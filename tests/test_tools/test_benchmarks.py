"""Every script of ``tools/benchmarks/`` runs (issue 54: benchmarks cannot
rot): each with ``--smoke`` (tiny sizes, one repeat) exits 0 and prints its
figure lines. Timings stay out of the verdict: only that a figure line is
printed, with a number where the figure goes.

These launches cost minutes of CPU (a Python process each, most of them
training the demo): they carry the ``benchmarks`` marker and run in
``make test-benchmarks``, which ``.ci/run`` runs after ``make test``.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / 'tools' / 'benchmarks'
NUM = r'[-+]?\d+(\.\d+)?'

# script -> the figure lines its smoke run prints (regular expressions,
# searched line by line)
FIGURES = {
    'collector.py': (rf'^\s+2\s+{NUM}\s+{NUM}\s+{NUM}\s+{NUM}x',
                     rf'^200 names, one per step.* first updates {NUM} us'),
    'collector_names.py': (rf'^update\(\) with a small table: {NUM} us', ),
    'gpu.py': (r'StatsCollectorHook \(interval 10\):.*paired overhead', ),
    'hangs.py': (rf'^demo: \d+ iterations, median {NUM} ms',
                 r'^1,000 ranks by the same arithmetic: '),
    'health_module.py': (rf'^watch_nonfinite=True\s+{NUM} ms', ),
    'health_spikes_histograms.py':
    (rf'^spikes \(defaults\): hook time per publication \(ms\)\s+{NUM}', ),
    'health_throughput.py':
    (rf'^the hook own CPU time per iteration \(us\)\s+{NUM}', ),
    'long_run.py': (rf'^median ms per iteration: first 10: {NUM}', ),
    'module_act_compile.py': (rf'^\s+bare op:\s+{NUM} us per call', ),
    'module_stats.py':
    (rf'^instrumented iteration: instrument_ms reported \(ms\)\s+{NUM}', ),
    'precise_bn.py': (
        rf'^\s+mmstats\s+{NUM}',
        rf'^\s+scaled_all_reduce\s+{NUM}',
        rf'^  2 \(persistent\)\s+{NUM}',
    ),
    'precise_bn_sharded.py':
    (rf'^FSDP1\s+\|\s+{NUM}', rf'^FSDP2\s+\|\s+{NUM}'),
    'preemption.py': (rf"^rank1 got SIGTERM at epoch 2's first log line: "
                      rf'checkpoint complete {NUM} s later', ),
    'publication.py': (rf'^\s+10\s+40\s+{NUM}\s+{NUM}', ),
    'report.py': (rf'^0-d float32\s+\d+\s+\d+\s+{NUM}',
                  rf'^Collector\.update\(\) \(3 all_reduces\)\s+{NUM}',
                  rf'^compiled forward, 3 report\(\) calls\s+{NUM} us',
                  rf'^\.\.\. \+ StatsCollectorHook\(interval=1\)\s+{NUM}'),
    'report_ab.py': (rf'^0-d float32\s+\d+\s+\d+\s+{NUM}\s+{NUM}', ),
    'sketch.py': (rf'^update\(\) of 10 loss names: {NUM} / {NUM} ms', ),
}


def scripts():
    """The scripts of tools/benchmarks (a module other scripts import, with
    no ``__main__`` block, runs through them)."""
    return sorted(
        p.name for p in BENCHMARKS.glob('*.py')
        if "__name__ == '__main__'" in p.read_text())


def test_every_script_has_its_figures_listed():
    assert scripts() == sorted(FIGURES)


@pytest.mark.benchmarks
@pytest.mark.parametrize('script', sorted(FIGURES))
def test_smoke_run_prints_its_figures(script):
    paths = (str(ROOT), str(ROOT / 'projects' / 'digits_demo'),
             os.environ.get('PYTHONPATH'))
    env = dict(
        os.environ,
        OMP_NUM_THREADS='1',
        PYTHONPATH=os.pathsep.join(p for p in paths if p))
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), '--smoke'],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for figure in FIGURES[script]:
        found = any(re.search(figure, line) for line in lines)
        assert found, (figure, proc.stdout)
