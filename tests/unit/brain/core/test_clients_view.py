"""`vancetope clients` (table and --json) shows a suspended client and why (pure)."""

from __future__ import annotations

from rich.console import Console

from brain.cli.display import clients_table
from brain.core.client_health import Mark
from brain.core.models import Enrollment
from brain.core.report import clients_report

ENROLLED = {
    cid: Enrollment(client_id=cid, user=user, enrolled_at=1.0)
    for cid, user in (("laptop", "ada"), ("mallory", "eve"))
}
MARKS = {"mallory": Mark(causes={"heartbeat encoding": "its heartbeat is not UTF-8 text"}, since=2.0)}


def test_clients_json_names_the_cause_of_a_suspended_client_and_null_for_the_others() -> None:
    rows = {c["client_id"]: c for c in clients_report(ENROLLED, {}, {}, misbehaving=MARKS)["clients"]}
    assert rows["mallory"]["misbehaving"] == "its heartbeat is not UTF-8 text"
    assert rows["laptop"]["misbehaving"] is None
    assert clients_report(ENROLLED, {}, {})["clients"][1]["misbehaving"] is None


def test_the_clients_table_shows_misbehaving_with_its_cause() -> None:
    console = Console(width=200, record=True)
    console.print(clients_table(ENROLLED, {}, {}, MARKS))
    text = console.export_text()
    assert "misbehaving: its heartbeat is not UTF-8 text" in text
    assert "offline" in text  # laptop


def test_the_clients_table_shows_bound_work_on_its_client_only_and_unbound_work_as_any_client_of_the_user() -> (
    None
):
    """Issue 22 item 2: work bound to laptop2 showed as waiting for both of the user's clients."""
    enrolled = {cid: Enrollment(client_id=cid, user="ada", enrolled_at=1.0) for cid in ("laptop", "laptop2")}
    console = Console(width=200, record=True)
    console.print(clients_table(enrolled, {}, {"client:laptop2": 2, "user:ada": 3}))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if "│" in line}
    assert rows["laptop2"].split("│")[7].strip() == "2 + 3 for any client of user ada"
    assert rows["laptop"].split("│")[7].strip() == "3 for any client of user ada"
