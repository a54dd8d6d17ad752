"""Bounded YAML (layer: brain/core; pure).

One job: parse YAML text without letting aliases expand it beyond a bound, and without
dropping a key written twice. A
"billion laughs" document is a few hundred bytes whose anchors and aliases expand
to 10^9 nodes: PyYAML builds it as a small shared graph, and whatever walks the
result afterwards (validation, JSON) hangs for good. ``load`` composes the node
graph, counts the nodes it *expands* to (memoised, so counting is linear in the
file) and refuses the document before anything is constructed from it.
"""

from __future__ import annotations

from typing import Any

import yaml

# Nodes that aliases may add on top of the nodes written in the file. Real files use a
# few anchors for shared arguments; this leaves them ample room.
MAX_ALIAS_EXPANSION = 100_000


class YAMLTooLarge(ValueError):
    """The document expands, through aliases, beyond the bound (or refers to itself)."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that checks each composed document before constructing it."""

    max_expansion = MAX_ALIAS_EXPANSION

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            check_expansion(node, self.max_expansion)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # PyYAML keeps the last of two equal keys: `id: x` then `id: y` read as y, silently.
        seen: dict[tuple[str, str], yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # keys merged in with << may be overridden: that is what << is for
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"the key {key_node.value!r} appears twice (first at line "
                    f"{seen[key].start_mark.line + 1}); only one of them can be meant",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep)


def load(text: str, max_expansion: int = MAX_ALIAS_EXPANSION) -> Any:
    """``yaml.safe_load`` with the alias bound. Raises YAMLTooLarge or yaml.YAMLError."""
    loader = _BoundedLoader(text)
    loader.max_expansion = max_expansion
    try:
        return loader.get_single_data()
    except RecursionError:
        # PyYAML composes recursively: nesting a few hundred levels deep exhausts the stack.
        raise YAMLTooLarge("the YAML is nested too deeply to read") from None
    finally:
        loader.dispose()


def check_expansion(root: yaml.Node, max_expansion: int) -> None:
    """Raise YAMLTooLarge when ``root`` expands to more than its distinct nodes + ``max_expansion``,
    or when an alias refers to a node that contains it (a recursive document)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: a deeply nested file must not exhaust Python's stack.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > len(sizes) + max_expansion:
                raise YAMLTooLarge(_too_large(node, max_expansion))
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YAMLTooLarge(f"{_where(node)}: an alias refers to a node that contains it (recursive YAML)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _where(node: yaml.Node) -> str:
    mark = node.start_mark
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "the document"


def _too_large(node: yaml.Node, max_expansion: int) -> str:
    return (
        f"YAML aliases expand the document beyond {max_expansion} extra nodes (at {_where(node)}); "
        "refusing it (a 'billion laughs' document?). Write the values out or use fewer aliases"
    )
