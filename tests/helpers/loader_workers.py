"""Stop the DataLoader worker processes a test left running.

A ``DataLoader`` with ``persistent_workers=True`` (a Runner's, or
PreciseBNHook's own loader) keeps its worker processes until its iterator
is collected. A Runner sits in reference cycles, so that happens in a later
garbage collection, and there torch's shutdown loses its race with the
collection: the index queues are finalised before the iterator's
``__del__`` sends the workers their stop signal, so each worker is joined
for ``MP_STATUS_CHECK_INTERVAL`` (5 s) and then killed. A test that merely
triggered a collection waited 5 s per leaked worker (60 s seen). Stopped
explicitly while their queues still work, they exit at once.
"""
import gc
import multiprocessing


def stop_loader_workers(keep=()) -> int:
    """Shut down the workers of every live multi-process DataLoader
    iterator (used after a test or a distributed task, whose loaders are
    garbage by then). The objects are searched only while this process has
    a child process other than those in ``keep`` (process ids: the pooled
    gloo ranks). Returns how many iterators were stopped.

    Example:
        >>> stop_loader_workers()  # nothing running
        0
    """
    if all(p.pid in keep for p in multiprocessing.active_children()):
        return 0
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter
    stopped = 0
    for obj in gc.get_objects():
        # type(), not isinstance(): a dead weak proxy raises on the latter
        if issubclass(type(obj), _MultiProcessingDataLoaderIter) and \
                not getattr(obj, '_shutdown', True):
            obj._shutdown_workers()
            stopped += 1
    return stopped
