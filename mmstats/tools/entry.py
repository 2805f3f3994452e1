# Copyright (c) mmstats contributors. All rights reserved.
"""How a launcher's process ends: the console scripts' exit status, the
one line a failure prints, and the failure's reason written where people
look (the run's ``.log`` and torchrun's ``Root Cause``).

- :func:`console_main` is what ``mmstats-train`` / ``mmstats-test`` /
  ``mmstats-plot`` / ``mmstats-consolidate`` and ``python -m
  mmstats.tools.X`` run: exit status 0 when the launcher returns (whatever
  it returns: ``mmstats-test`` returns its metrics), 1 after one line
  ``PROG: error: Type: message`` on stderr when it raises. The launcher
  runs under torch's
  :func:`torch.distributed.elastic.multiprocessing.errors.record`: under
  torchrun the exception and its traceback go to the error file the agent
  reads, so its ``Root Cause`` block shows them instead of
  ``error_file: <N/A>``.
- :func:`logged_failure` writes an exception that ends ``runner.train()``
  / ``runner.test()`` (a NaN's origin, a refused checkpoint, any error)
  with its traceback to the runner's log *files* (``WORK_DIR/<timestamp>/
  <timestamp>.log``) before the process ends: the console gets the one
  line above, not a second traceback.

``MMSTATS_TRACEBACK=1`` prints the traceback on stderr too (a failure
before the runner exists has no ``.log``). A console script puts the
current directory first on ``sys.path``, as ``python -m`` does: a config's
``custom_imports`` of a module beside it resolve the same either way.
"""
import contextlib
import logging
import os
import sys
import traceback
from typing import Any, Callable, Iterator, Optional

__all__ = ['console_main', 'logged_failure', 'failure_line']

#: the attribute :func:`logged_failure` sets on the exception it logged
LOG_FILES = '_mmstats_log_files'


def failure_line(prog: str, exc: BaseException) -> str:
    """The one line a failed launch prints: the program, the exception's
    type and text (its first line), and where its traceback was written.

    Example:
        >>> failure_line('mmstats-test', FileNotFoundError('no x.pth'))
        'mmstats-test: error: FileNotFoundError: no x.pth'
    """
    text = str(exc).strip().splitlines()
    line = f'{prog}: error: {type(exc).__name__}'
    line += f': {text[0]}' if text else ''
    files = getattr(exc, LOG_FILES, None)
    if files:
        line += f' (traceback in {", ".join(files)})'
    return line


@contextlib.contextmanager
def logged_failure(runner: Any) -> Iterator[None]:
    """Write an exception raised inside the block, with its traceback, to
    the file handlers of ``runner.logger`` (the run's ``.log``), then let
    it go on. Runners without a logger are passed by.

    Example:
        .. code-block:: python

            runner = build_runner(cfg)
            with logged_failure(runner):
                runner.train()
    """
    try:
        yield
    except BaseException as exc:
        logger = getattr(runner, 'logger', None)
        files = [
            h for h in getattr(logger, 'handlers', [])
            if isinstance(h, logging.FileHandler)
        ]
        if files:
            record = logger.makeRecord(
                logger.name, logging.ERROR, __file__, 0,
                f'the run failed: {type(exc).__name__}: {exc}', (),
                sys.exc_info())
            for handler in files:
                handler.handle(record)
                handler.flush()
            setattr(exc, LOG_FILES, [h.baseFilename for h in files])
        raise


def console_main(main: Callable[[Optional[list]], Any],
                 prog: str,
                 argv: Optional[list] = None,
                 quiet: Callable[[BaseException],
                                 bool] = lambda e: False) -> int:
    """Run ``main(argv)`` as a console script: 0 when it returns, 1 with
    one line on stderr (:func:`failure_line`) when it raises (``quiet``:
    exceptions the launcher already said). Under torchrun torch's
    ``record`` writes the exception for the agent's ``Root Cause``.

    Args:
        main (callable): The launcher's ``main(argv)``.
        prog (str): The name in the failure line.
        argv (list, optional): The arguments. Defaults to
            ``sys.argv[1:]``.
        quiet (callable): Which exceptions were already said. Defaults to
            none.

    Returns:
        int: The exit status.

    Example:
        >>> console_main(lambda argv: {'accuracy': 1.0}, 'mmstats-test', [])
        0
    """
    from torch.distributed.elastic.multiprocessing.errors import record
    if '' not in sys.path and os.getcwd() not in sys.path:  # python -m's
        sys.path.insert(0, os.getcwd())
    try:
        record(main)(argv)
    except SystemExit as exc:  # argparse's --help (0) and usage errors (2)
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(f'{prog}: error: {exc.code}', file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # KeyboardInterrupt keeps Python's own way
        if not quiet(exc):
            if os.environ.get('MMSTATS_TRACEBACK') == '1':
                traceback.print_exc()
            print(failure_line(prog, exc), file=sys.stderr, flush=True)
        return 1
    return 0
