"""pytest set-up of the Python module's tests.

The tests import `attn` from PYTHONPATH: CTest (tests/python.cmake) points it at the build's module,
so that what is tested is the build, not a copy installed in site-packages. Run them by hand with
  PYTHONPATH=build/release/python /usr/bin/python3 -m pytest -q python/tests
"""
import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    """A generator seeded by the test's name: every test draws its own numbers, the same each run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
