"""tests/slow_cases.py: the cases `make test` leaves to `make test-slow`, named by node id."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from slow_cases import KEPT_NODE_IDS, OTHER_FORMS, SLOW_NODE_IDS

from conftest import _check_slow_cases


def _item(nodeid, slow=False):
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: name if slow and name == "slow" else None)


def test_a_renamed_slow_case_or_a_kept_form_turned_slow_is_refused():
    slow, kept = frozenset({"tests/a.py::t[gloo]"}), frozenset({"tests/a.py::t[mpi]"})
    _check_slow_cases([_item("tests/a.py::t[gloo]", True), _item("tests/a.py::t[mpi]")], slow, kept)
    _check_slow_cases([_item("tests/b.py::u")], slow, kept)  # a.py not collected: nothing to say
    with pytest.raises(pytest.UsageError, match=r"names tests/a.py::t\[gloo\], which is not collected"):
        _check_slow_cases([_item("tests/a.py::t_renamed[gloo]", True), _item("tests/a.py::t[mpi]")], slow, kept)
    with pytest.raises(pytest.UsageError, match=r"keeps tests/a.py::t\[mpi\] in `make test`, but it is slow"):
        _check_slow_cases([_item("tests/a.py::t[gloo]", True), _item("tests/a.py::t[mpi]", True)], slow, kept)


def test_every_other_form_keeps_a_form_of_its_own_test_in_make_test():
    for slow_id, kept_id in OTHER_FORMS.items():
        assert slow_id != kept_id and slow_id.split("[")[0] == kept_id.split("[")[0], slow_id
    assert not KEPT_NODE_IDS & SLOW_NODE_IDS
