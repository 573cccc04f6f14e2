"""A pytest plugin (``-p record_stats``) that appends each test's ``minicompile.stats()``
(zeroed before every test by conftest.py) to the JSON-lines file named by
``MINICOMPILE_TEST_STATS``: how tests/dynamic/test_warm_runs.py compares two runs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield
    import minicompile  # (not at this plugin's import: conftest.py configures it first)

    with open(os.environ["MINICOMPILE_TEST_STATS"], "a") as f:
        f.write(json.dumps({"test": item.nodeid, "stats": minicompile.stats()}) + "\n")
