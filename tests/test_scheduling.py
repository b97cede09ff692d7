"""The suite's own scheduling: under ``pytest -n`` (``--dist loadgroup``), the tests that share a
trained run (one ``xdist_group``) go to one worker, which trains it while the others go on; if the
group did not reach the scheduler, workers would wait on each other's training instead."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("reverse")
def test_a_grouped_test_carries_its_group_to_the_scheduler(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest -n N --dist loadgroup, the suite's default")
    assert request.node.nodeid.endswith("@reverse"), (
        f"{request.node.nodeid}: xdist_group is ignored (is pytest too new for pytest-xdist?)"
    )
