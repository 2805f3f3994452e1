"""``report()`` before and after a change, in one run: host time and ATen
operations per call of two versions of mmstats side by side.

Exports ``mmstats/`` of a git revision (``--ref``, default ``main~1``) to a
temporary directory and measures it and the working tree alternately, each
in a fresh subprocess (``torch.set_num_threads(1)``, one Collector alive),
``--rounds`` times: per call of ``report()`` of a Python float, a 0-d
float32 tensor, 1,024 and 65,536 float32 elements, the median over rounds
of the mean time per call and the ATen operations a call issues in steady
state (``stylegan3_ref.count_aten_ops``: exact). Prints the medians and
the ratio after / before: alternation and medians keep the load of a shared
machine out of the ratio.

Usage: ``python tools/benchmarks/report_ab.py [--ref REV] [--rounds R]``
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# Runs in a subprocess whose sys.path starts with one tree.
_MEASURE = r'''
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
from mmstats.stats import Collector, report
import mmstats
assert mmstats.__file__.startswith(sys.argv[1]), mmstats.__file__
sys.path.append(sys.argv[2])  # tools/benchmarks, after the tree
from stylegan3_ref import count_aten_ops

values = {
    'float': 0.5,
    '0-d float32': torch.tensor(0.5),
    '1024 float32': torch.randn(1024),
    '65536 float32': torch.randn(65536),
}
calls = {'float': 20000, '0-d float32': 2000, '1024 float32': 1000,
         '65536 float32': 100}
collector = Collector()
out = {}
for key, value in values.items():
    report('x', value)  # steady state: a workspace is allocated once
    ops = len(count_aten_ops(lambda: report('x', value)))
    collector.update()
    best = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls[key]):
            report('x', value)
        best.append((time.perf_counter() - start) / calls[key] * 1e6)
        collector.update()
    out[key] = dict(us=statistics.median(best), ops=ops)
print(json.dumps(out))
'''


def measure(tree: str) -> dict:
    """One fresh-process measurement of the mmstats in ``tree``."""
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, '-c', _MEASURE, tree, HERE],
                         capture_output=True,
                         text=True,
                         env=env,
                         cwd=tree,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--ref', default='main~1')
    parser.add_argument('--rounds', type=int, default=7)
    parser.add_argument(
        '--smoke',
        action='store_true',
        help='tiny sizes, one repeat: checks the script runs (the suite)')
    args = parser.parse_args()
    if args.smoke:
        args.ref, args.rounds = 'HEAD', 1
    with tempfile.TemporaryDirectory() as before:
        archive = subprocess.run(['git', 'archive', args.ref, 'mmstats'],
                                 cwd=ROOT,
                                 capture_output=True,
                                 check=True).stdout
        subprocess.run(['tar', '-x', '-C', before], input=archive, check=True)
        runs = {'before': [], 'after': []}
        for _ in range(args.rounds):  # alternate: the same load for both
            runs['before'].append(measure(before))
            runs['after'].append(measure(ROOT))
    commit = subprocess.run(['git', 'rev-parse', '--short', args.ref],
                            cwd=ROOT,
                            capture_output=True,
                            text=True).stdout.strip()
    print(f'report() per call: {args.ref} ({commit}) vs the working tree, '
          f'median of {args.rounds} alternating rounds, 1 thread')
    print(f'{"value":16} {"ops before":>10} {"ops after":>9} '
          f'{"us before":>10} {"us after":>9} {"after/before":>12}')
    for key in runs['before'][0]:
        ops_b = runs['before'][0][key]['ops']
        ops_a = runs['after'][0][key]['ops']
        us_b = statistics.median(r[key]['us'] for r in runs['before'])
        us_a = statistics.median(r[key]['us'] for r in runs['after'])
        print(f'{key:16} {ops_b:>10} {ops_a:>9} {us_b:>10.3f} {us_a:>9.3f} '
              f'{us_a / us_b:>11.2f}x')


if __name__ == '__main__':
    main()
