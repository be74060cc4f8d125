import importlib.util

import pytest

from ..conftest import REPO


@pytest.fixture(scope="module")
def chaos():
    """bench/chaos.py as a module: its comparison of two runs (tables, records, wall times)."""
    spec = importlib.util.spec_from_file_location("chaos_bench", REPO / "bench" / "chaos.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
