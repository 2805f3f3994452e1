"""The way of one reported value through mmstats' files, measured.

Runs a real mmengine Runner (2 iterations, ``StatsCollectorHook``
publishing after the second, a LocalVisBackend writing ``scalars.json``:
``tools/benchmarks/publication.py``'s) whose model reports one eager Python
float per forward on the main thread,
and records with :func:`sys.setprofile` every call into a file of the
``mmstats`` package during two windows: the ``report()`` call of the
second iteration, and the hook's ``after_train_iter`` that publishes (the
collector's update, the formatting, the visualizer's write).
The hook collects nothing of its own (``collect=()``), so that only the traced
value travels.

Prints the files in the order the value enters them, and:

* ``files``: distinct mmstats files entered;
* ``functions``: distinct mmstats functions called;
* ``switches``: calls from one mmstats file into another (a call from
  outside mmstats, e.g. mmengine's hook loop, counts from the last mmstats
  file on the stack);
* ``returns``: switches into a file the same window had already entered
  (the call chain running back up, or coming back to a file it left),
  except calls made by the hook's own file: the hook orchestrates (it
  asks the schedule, the collector, then formats).

Usage: ``python tools/analysis/report_path.py [--verbose]``
"""
import argparse
import os
import sys
import tempfile
from typing import List, Optional, Tuple

import mmstats

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'benchmarks'))
import publication  # noqa: E402
from publication import reporting_runner  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(mmstats.__file__))


class _Tracer:
    """Records (file, function, caller file) of calls into mmstats."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, str, Optional[str]]] = []
        self.windows: List[int] = []  # where each window's calls start

    def __call__(self, frame, event: str, arg) -> None:
        if event != 'call':
            return
        path = frame.f_code.co_filename
        if not path.startswith(PACKAGE):
            return
        caller, back = None, frame.f_back
        while back is not None:  # the nearest mmstats frame below
            if back.f_code.co_filename.startswith(PACKAGE):
                caller = _short(back.f_code.co_filename)
                break
            back = back.f_back
        self.calls.append((_short(path), frame.f_code.co_qualname, caller))

    def trace(self, fn):
        """``fn`` with its calls recorded."""

        def traced(*args, **kwargs):
            self.windows.append(len(self.calls))
            sys.setprofile(self)
            try:
                return fn(*args, **kwargs)
            finally:
                sys.setprofile(None)

        return traced


def _short(path: str) -> str:
    """``mmstats/...`` of a file of the package."""
    return os.path.relpath(path, os.path.dirname(PACKAGE))


def measure(calls: List[Tuple[str, str, Optional[str]]], windows: List[int],
            hook_file: str) -> dict:
    """The path's counts (see the module docstring)."""
    order: List[str] = []
    switches, returns = 0, 0
    bounds = windows + [len(calls)]
    for start, end in zip(bounds[:-1], bounds[1:]):
        entered: set = set()
        current: Optional[str] = None
        for path, _, caller in calls[start:end]:
            caller = caller or current
            if path not in order:
                order.append(path)
            if caller is not None and caller != path:
                switches += 1
                if path in entered and caller != hook_file:
                    returns += 1
            entered.add(path)
            current = path
    # comprehensions are functions of their own before Python 3.12
    anonymous = ('<listcomp>', '<genexpr>', '<dictcomp>', '<setcomp>',
                 '<lambda>')
    functions = {(p, f)
                 for p, f, _ in calls
                 if not f.rpartition('.')[2].startswith(anonymous)}
    return dict(
        order=order,
        files=len(order),
        functions=len(functions),
        switches=switches,
        returns=returns)


def run(verbose: bool = False) -> dict:
    """Train 2 iterations, trace the second report and the publication."""
    tracer = _Tracer()
    with tempfile.TemporaryDirectory() as work_dir:
        runner = reporting_runner(
            work_dir,
            names=1,
            iters=2,
            hook=dict(collect=()),
            logger_interval=2)
        hook = next(
            h for h in runner.hooks
            if type(h).__name__ == 'StatsCollectorHook')
        hook_file = _short(sys.modules[type(hook).__module__].__file__)
        model_forward = runner.model.forward
        iteration = [0]

        def forward(*args, **kwargs):
            iteration[0] += 1
            if iteration[0] < 2:
                return model_forward(*args, **kwargs)
            original = publication.report  # the model's module global
            publication.report = tracer.trace(original)
            try:
                return model_forward(*args, **kwargs)
            finally:
                publication.report = original

        runner.model.forward = forward
        after = hook.after_train_iter

        def after_train_iter(runner, batch_idx, *args, **kwargs):
            if batch_idx == 1:
                return tracer.trace(after)(runner, batch_idx, *args, **kwargs)
            return after(runner, batch_idx, *args, **kwargs)

        hook.after_train_iter = after_train_iter
        runner.train()
    result = measure(tracer.calls, tracer.windows, hook_file)
    if verbose:
        for path, fn, caller in tracer.calls:
            print(f'  {caller or "-":40} -> {path}:{fn}')
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--verbose', action='store_true')
    args = parser.parse_args()
    result = run(args.verbose)
    print('files in order:', ' -> '.join(result['order']))
    print('files {files}  functions {functions}  switches {switches}  '
          'returns into a file already left {returns}'.format(**result))


if __name__ == '__main__':
    main()
