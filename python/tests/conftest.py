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


# Hypothesis profiles of the generated tests (test_generated.py): "ci", the default, derandomised
# (the same examples every run) with a fixed number of them and no example database; "long", for
# people, many more random examples, failures kept in .hypothesis/ to be replayed first next run:
#   ATTN_HYPOTHESIS_PROFILE=long PYTHONPATH=build/release/python /usr/bin/python3 -m pytest -q python/tests/test_generated.py
try:
    import os

    from hypothesis import HealthCheck, settings

    _slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=250, derandomize=True, deadline=None, database=None,
                              suppress_health_check=_slow, print_blob=True)
    settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=_slow, print_blob=True)
    settings.load_profile(os.environ.get("ATTN_HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # without Hypothesis, test_generated.py skips itself
    pass
