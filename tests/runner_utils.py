"""Deprecated shim: the demo-based real-Runner configs for older tests.

New core tests use the toy BN model: ``tests.helpers.runner.toy_cfg`` (and
``gloo_launch``). The demo's own helpers live in
``projects/digits_demo/tests/demo_utils.py``; this module re-exports them
until the last core test has moved to ``tests.helpers``.
"""
import importlib
import os.path as osp
import sys

_REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
_DEMO_TESTS = osp.join(_REPO, 'projects', 'digits_demo', 'tests')
if _DEMO_TESTS not in sys.path:
    sys.path.insert(0, _DEMO_TESTS)

_demo_utils = importlib.import_module('demo_utils')
EPOCH_CONFIG = _demo_utils.EPOCH_CONFIG
ITER_CONFIG = _demo_utils.ITER_CONFIG
MAIN_CONFIG = _demo_utils.MAIN_CONFIG
REPO = _demo_utils.REPO
recording_config = _demo_utils.recording_config
run_train = _demo_utils.run_train
small_cfg = _demo_utils.small_cfg

__all__ = [
    'EPOCH_CONFIG', 'ITER_CONFIG', 'MAIN_CONFIG', 'REPO', 'recording_config',
    'run_train', 'small_cfg'
]
