"""The ``slow`` marker's list (tests/slow_unit_tests.txt, left out by ``make check``) and its generator."""

from __future__ import annotations

import pytest
from tests.slow_unit_tests import LIST, THRESHOLD, durations, slow

REPORT = """
============================== slowest durations ===============================
2.50s call     tests/unit/test_a.py::test_x[one two]
0.60s setup    tests/unit/test_a.py::test_y
0.50s call     tests/unit/test_a.py::test_y
0.20s call     tests/unit/test_b.py::TestC::test_z
3.00s call     tests/integration/test_d.py::test_w
"""


def test_durations_sum_setup_call_and_teardown_of_unit_tests():
    assert durations(REPORT) == pytest.approx({"tests/unit/test_a.py::test_x[one two]": 2.5,
                                               "tests/unit/test_a.py::test_y": 1.1,
                                               "tests/unit/test_b.py::TestC::test_z": 0.2})
    assert slow(REPORT, THRESHOLD) == ["tests/unit/test_a.py::test_x[one two]", "tests/unit/test_a.py::test_y"]


def test_listed_tests_are_in_files_that_exist(request):
    lines = [line for line in LIST.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert lines == sorted(set(lines)), "tests/slow_unit_tests.txt: expected sorted, unique test ids"
    root = request.config.rootpath
    missing = sorted({line.split("::")[0] for line in lines if not (root / line.split("::")[0]).is_file()})
    assert not missing, (f"tests/slow_unit_tests.txt lists tests of files that do not exist: {missing}; rewrite it "
                         "with tests/slow_unit_tests.py (its docstring says how)")


def test_listed_tests_are_marked_slow():
    """tests/conftest.py marks ``slow`` exactly the collected tests that the list names."""
    from tests.conftest import pytest_collection_modifyitems

    class Item:
        def __init__(self, nodeid: str):
            self.nodeid, self.markers = nodeid, []

        def add_marker(self, marker) -> None:
            self.markers.append(marker.name)

    listed = next(line for line in LIST.read_text(encoding="utf-8").splitlines() if not line.startswith("#"))
    items = [Item(listed), Item("tests/unit/test_slow_list.py::test_listed_tests_are_marked_slow")]
    pytest_collection_modifyitems(None, items)
    assert [item.markers for item in items] == [["slow"], []]
