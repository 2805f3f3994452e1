# Sphinx configuration: the API reference built from the docstrings.
# `make docs` builds it warning-free (sphinx -W) into docs/_build/html.
import os
import sys

sys.path.insert(0, os.path.abspath('..'))

project = 'mmstats'
copyright = '2026, mmstats contributors'
author = 'mmstats contributors'
extensions = [
    'sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'sphinx.ext.viewcode'
]
napoleon_google_docstring = True
autodoc_member_order = 'bysource'
autodoc_typehints = 'none'  # the docstrings name the types
exclude_patterns = ['_build', '*.md']
html_theme = 'alabaster'
nitpicky = False
