"""Input limits on tree and registry files: file size and YAML alias expansion (brain.core.safeyaml,
brain.core.treefile). Each is refused with InvalidFile before anything is built from the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from brain.core import safeyaml
from brain.core.treefile import load_registry, load_tree
from brain.errors import InvalidFile

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
TREE = "id: t\ntasks:\n  - id: a\n    tool: echo\n    args: {text: hi}\n"


def laughs(levels: int, width: int = 9) -> str:
    """A "billion laughs" document: ``width ** levels`` nodes from a few hundred bytes."""
    lines = ["l0: &l0 " + str(["lol"] * width).replace("'", '"')]
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: &x [1, 2]\nb: *x\n", {"a": [1, 2], "b": [1, 2]}),
        (
            "base: &b {tool: echo}\none: {<<: *b, id: a}\n",
            {"base": {"tool": "echo"}, "one": {"tool": "echo", "id": "a"}},
        ),
        (laughs(3), None),  # 9^3 = 729 nodes: a shared structure of modest size still loads
    ],
)
def test_aliases_within_the_bound_load_as_yaml_safe_load_would(text: str, expected: object) -> None:
    import yaml

    loaded = safeyaml.load(text)
    assert loaded == (expected if expected is not None else yaml.safe_load(text))


def test_a_billion_laughs_document_is_refused_quickly() -> None:
    with pytest.raises(safeyaml.YAMLTooLarge, match="billion laughs"):
        safeyaml.load(laughs(9))


def test_expansion_just_over_the_bound_is_refused() -> None:
    with pytest.raises(safeyaml.YAMLTooLarge, match="beyond 500 extra nodes"):
        safeyaml.load(laughs(3), max_expansion=500)


def test_a_recursive_alias_is_refused() -> None:
    with pytest.raises(safeyaml.YAMLTooLarge, match="recursive YAML"):
        safeyaml.load("a: &a [1, *a]\n")


@pytest.mark.parametrize(("name", "head"), [("deep.yaml", "id: t\ntasks: "), ("deep.json", "")])
def test_a_deeply_nested_file_is_refused_not_a_recursion_traceback(
    tmp_path: Path, name: str, head: str
) -> None:
    path = tmp_path / name
    path.write_text(head + "[" * 50_000 + "]" * 50_000)
    with pytest.raises(InvalidFile, match="nested too deeply"):
        load_tree(path)


def test_a_billion_laughs_tree_file_is_refused_naming_the_file() -> None:
    path = FIXTURES / "billion_laughs.yaml"
    with pytest.raises(InvalidFile) as caught:
        load_tree(path)
    assert caught.value.path == str(path)
    assert "YAML aliases expand the document beyond" in str(caught.value)


def test_a_billion_laughs_registry_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "registry.yaml"
    path.write_text(laughs(9) + "tools: []\n")
    with pytest.raises(InvalidFile, match="billion laughs"):
        load_registry(path)


@pytest.mark.parametrize(("limit", "loads"), [(len(TREE), True), (len(TREE) - 1, False)])
def test_a_tree_file_over_max_bytes_is_refused_before_it_is_parsed(
    tmp_path: Path, limit: int, loads: bool
) -> None:
    path = tmp_path / "tree.yaml"
    path.write_text(TREE)
    if loads:
        assert load_tree(path, max_bytes=limit).id == "t"
        return
    with pytest.raises(InvalidFile) as caught:
        load_tree(path, max_bytes=limit)
    assert f"larger than the limit of {limit} bytes (max_tree_bytes" in str(caught.value)


def test_the_size_limit_is_checked_before_decoding_so_a_cut_character_does_not_matter(tmp_path: Path) -> None:
    path = tmp_path / "tree.yaml"
    path.write_text("id: t\ngoal: " + "é" * 100 + "\ntasks: []\n", encoding="utf-8")
    with pytest.raises(InvalidFile, match="larger than the limit of 20 bytes"):
        load_tree(path, max_bytes=20)


@pytest.mark.parametrize(
    ("text", "line", "key", "first"),
    [
        ("id: x\ntasks:\n  - {id: a, tool: echo}\nid: y\n", 4, "id", 1),  # the later one won, silently
        ("id: t\ntasks:\n  - id: a\n    tool: echo\n    tool: sleep\n", 5, "tool", 4),
    ],
)
def test_a_key_written_twice_is_refused_naming_both_lines(
    tmp_path: Path, text: str, line: int, key: str, first: int
) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(InvalidFile) as raised:
        load_tree(path)
    assert f"line {line}, column" in str(raised.value)
    assert f"the key {key!r} appears twice (first at line {first})" in str(raised.value)


def test_keys_merged_in_with_an_alias_may_still_be_overridden() -> None:
    assert safeyaml.load("base: &b {k: 1, j: 2}\nmine:\n  <<: *b\n  k: 3\n")["mine"] == {"k": 3, "j": 2}
