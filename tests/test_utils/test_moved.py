"""Moved public import paths keep an alias for one release (issue 54): the
old path gives the new object and warns once, naming the new path and the
release that removes the old one. The list below is the contract; an alias
past its removal release fails here until it is deleted."""
import importlib
import sys
import warnings

import pytest

import mmstats
from mmstats.utils.moved import MOVED, resolve

#: every alias and the release that removes it
ALIASES = {
    'mmstats.utils.launch_setup': '0.4.0',
    'mmstats.utils.cpu_dist': '0.4.0',
    'mmstats.utils.checkpoint': '0.4.0',
    'mmstats.utils.allow_checkpoints': '0.4.0',
    'mmstats.utils.step_records': '0.4.0',
    'mmstats.utils.allow_mmengine_checkpoints': '0.4.0',
    'mmstats.utils.check_checkpoints': '0.4.0',
    'mmstats.utils.check_runner_type': '0.4.0',
    'mmstats.utils.finish_distributed': '0.4.0',
    'mmstats.utils.init_cpu_distributed': '0.4.0',
    'mmstats.utils.registered_name': '0.4.0',
    'mmstats.utils.setup_launcher': '0.4.0',
    'mmstats.utils.build_runner': '0.4.0',
    'mmstats.utils.enable_config_scope': '0.4.0',
}


def _version(text):
    return tuple(int(part) for part in text.split('.'))


def test_the_aliases_are_the_listed_ones_and_not_overdue():
    assert {old: removal for old, (_, removal) in MOVED.items()} == ALIASES
    for removal in ALIASES.values():  # kept for one release, then removed
        assert _version(mmstats.__version__) < _version(removal)


@pytest.mark.parametrize('old', sorted(ALIASES))
def test_an_old_path_gives_the_new_object_and_warns_naming_it(old):
    new, removal = MOVED[old]
    sys.modules.pop(old, None)  # a module alias warns when first imported
    package, _, name = old.rpartition('.')
    namespace = vars(importlib.import_module(package))
    namespace.pop(name, None)  # a name alias warns when first read
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        if old in ('mmstats.utils.cpu_dist', 'mmstats.utils.launch_setup',
                   'mmstats.utils.checkpoint', 'mmstats.utils.step_records',
                   'mmstats.utils.allow_checkpoints'):
            got = importlib.import_module(old)
        else:
            got = getattr(importlib.import_module(package), name)
    assert got is resolve(new)
    messages = [
        str(w.message) for w in caught if issubclass(w.category, FutureWarning)
    ]
    assert len(messages) == 1, messages
    assert new in messages[0] and removal in messages[0], messages


def test_an_unknown_name_of_utils_is_an_attribute_error():
    with pytest.raises(AttributeError, match='no_such_name'):
        mmstats.utils.no_such_name
