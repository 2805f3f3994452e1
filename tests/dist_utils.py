"""Deprecated shim: use ``tests.helpers.dist`` (same names)."""
from tests.helpers.dist import free_port, run_distributed

__all__ = ['free_port', 'run_distributed']
