"""What one user lists of resources and prompts, and where each read goes (brain/gateway/surface.py)."""

from __future__ import annotations

import pytest

from brain.core.models import Location
from brain.gateway.catalog import GatewayTool
from brain.gateway.surface import surface_of, template_pattern
from workers.contracts import McpSurface
from workers.toolnames import qualified


def reader(
    server: str,
    uris: tuple[str, ...] = (),
    templates: tuple[str, ...] = (),
    *,
    available: bool = True,
    truncated: bool = False,
) -> GatewayTool:
    return GatewayTool(
        name=f"{server}#read_resource",
        pool=server,
        action=f"{server}#read_resource",
        location=Location.SERVER,
        available=available,
        surface=McpSurface(
            resources=[{"uri": u, "name": u.rsplit("/", 1)[-1]} for u in uris],
            resource_templates=[{"uriTemplate": t, "name": "t"} for t in templates],
            truncated=truncated,
        ),
    )


def prompts(server: str, *names: str) -> GatewayTool:
    return GatewayTool(
        name=f"{server}#get_prompt",
        pool=server,
        action=f"{server}#get_prompt",
        location=Location.CLIENT,
        surface=McpSurface(prompts=[{"name": n} for n in names]),
    )


def completer(server: str) -> GatewayTool:
    return GatewayTool(name=f"{server}#complete", pool=server, action="c", location=Location.SERVER)


@pytest.mark.parametrize(
    ("template", "uri", "matches"),
    [
        ("note://{name}", "note://garden", True),
        ("note://{name}", "note://a/b", False),  # a simple variable is one segment
        ("file:///{+path}", "file:///home/ada/notes.md", True),
        ("repo://{owner}/{repo}/issues{?state}", "repo://ada/vault/issues?state=open", True),
        ("repo://{owner}/{repo}/issues{?state}", "repo://ada/vault/issues", True),
        ("test://template/{id}/data", "test://template/42/data", True),
        ("test://template/{id}/data", "test://template/42/other", False),
        ("a.b://{x}", "aXb://y", False),  # the literal parts are literal
    ],
)
def test_a_template_matches_the_uris_it_expands_to(template: str, uri: str, matches: bool) -> None:
    assert bool(template_pattern(template).fullmatch(uri)) is matches


def test_a_uri_is_read_from_the_server_that_listed_it_then_by_template_and_a_clash_is_reported() -> None:
    found = surface_of(
        [
            reader("everything", ("test://static/1", "shared://x")),
            reader("vault", ("note://garden", "shared://x"), ("note://{name}",)),
        ]
    )
    assert [r["uri"] for r in found.resources] == ["test://static/1", "shared://x", "note://garden"]
    assert found.reader_of("test://static/1") == "everything#read_resource"
    assert found.reader_of("shared://x") == "everything#read_resource"  # the first lister
    assert found.reader_of("note://groceries") == "vault#read_resource"  # by its template
    assert found.reader_of("gopher://nothing") is None  # two servers, nothing says which
    assert found.clashes == [
        "resource 'shared://x' is listed by MCP servers 'everything', 'vault': it is read from 'everything'"
    ]


@pytest.mark.parametrize(
    ("tools", "uri", "expected"),
    [
        ([reader("only", ("a://1",))], "b://2", "only#read_resource"),  # the one server with resources
        ([reader("a", ("a://1",)), reader("b", ("b://1",), truncated=True)], "c://1", "b#read_resource"),
        # A workstation's server declared in the registry, its client offline: routed, so its
        # offline strategy says what happens (park, wait, refuse).
        ([reader("vault", available=False)], "note://x", "vault#read_resource"),
        ([reader("everything", ("t://1",)), reader("vault", available=False)], "note://x", None),
    ],
)
def test_a_uri_nobody_listed(tools: list[GatewayTool], uri: str, expected: str | None) -> None:
    assert surface_of(tools).reader_of(uri) == expected


def test_prompts_are_bare_while_unique_and_qualified_by_server_when_shared() -> None:
    found = surface_of([prompts("vault", "summarize_note", "greet"), prompts("everything", "greet")])
    listed = {p.name: (p.upstream, p.tool) for p in found.prompts}
    assert listed == {
        "summarize_note": ("summarize_note", "vault#get_prompt"),
        qualified("vault", "greet"): ("greet", "vault#get_prompt"),
        qualified("everything", "greet"): ("greet", "everything#get_prompt"),
    }
    assert all(found.prompt(n).wire["name"] == n for n in listed)  # type: ignore[union-attr]


def test_completion_goes_to_the_server_of_the_prompt_or_template_and_only_if_it_completes() -> None:
    found = surface_of(
        [
            prompts("vault", "summarize_note"),
            reader("vault", templates=("note://{name}",)),
            completer("vault"),
            prompts("plain", "hello"),
        ]
    )
    assert found.completer_of({"type": "ref/prompt", "name": "summarize_note"}) == "vault#complete"
    assert found.completer_of({"type": "ref/resource", "uri": "note://{name}"}) == "vault#complete"
    assert found.completer_of({"type": "ref/prompt", "name": "hello"}) is None  # plain completes nothing
    assert found.completer_of({"type": "ref/prompt", "name": "nope"}) is None


def test_a_resource_nobody_offers_names_the_users_offline_clients() -> None:
    from brain.gateway.server import unknown_resource

    alone = unknown_resource("note://x", ())
    assert "'note://x' is not offered by any MCP server of yours" in alone and "offline" not in alone
    named = unknown_resource("note://x", ("desk", "laptop"))
    assert "Your client(s) 'desk', 'laptop' are offline" in named and "start its client agent" in named
