"""The MCP conformance suite through the gateway (issue 24): a regression guard, and the score in
CI's log (the table is printed in pytest's terminal summary, "MCP conformance").

The harness is tests/conformance/run.py; the same run by hand: ``python -m tests.conformance.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conformance.run import ROUTES, RouteResult, Suite, measure, table
from tests.conftest import NpmMissing, npm_required

pytestmark = pytest.mark.integration

# What the gateway scores today on each route, of the suite's 32 server scenarios (measured by
# this harness on 2026-12-02). The goal is 32 on both: raise a floor when the gateway passes more,
# never lower one to make CI pass.
FLOOR = {"server": 32, "client": 32}
SCENARIOS = 32


def failed(result: RouteResult) -> str:
    return "\n".join(f"  {s.scenario}: {'; '.join(s.failures)}" for s in result.scenarios if not s.passed)


def test_the_gateway_keeps_its_conformance_score_on_both_routes(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    try:
        Suite.install()
    except NpmMissing:
        npm_required("the MCP conformance suite (tests/conformance)", "npm not found")
    results = {r.route: r for r in measure(ROUTES, None, jobs=2, work=tmp_path)}
    # Shown in the terminal summary whatever happens below (tests/conftest.py).
    record_property("conformance_table", table(list(results.values())))

    direct = results["direct"]
    assert direct.error is None, direct.error
    assert direct.total == SCENARIOS, (
        f"the pinned suite lists {direct.total} server scenarios, not {SCENARIOS}"
    )
    # The baseline: the reference server alone passes everything, or the harness is broken.
    assert direct.passed == SCENARIOS, f"the reference server alone failed:\n{failed(direct)}"
    for route, floor in FLOOR.items():
        result = results[route]
        assert result.error is None, f"{route} route: {result.error}"
        assert result.passed >= floor, (
            f"{route} route: {result.passed}/{result.total}, below its floor of {floor}:\n{failed(result)}"
        )
