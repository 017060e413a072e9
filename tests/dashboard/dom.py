"""Just enough of an HTML tree to find elements by tag, class and data attributes in rendered pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = frozenset({"meta", "link", "input", "br", "img", "hr", "col", "source", "path", "line", "rect"})


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node | str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> list[Node]:
        out: list[Node] = [self]
        for c in self.children:
            if isinstance(c, Node):
                out += c.walk()
        return out

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        def ok(n: Node) -> bool:
            wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
            return (
                (tag is None or n.tag == tag)
                and (cls is None or cls in n.classes)
                and all(n.attrs.get(k) == v for k, v in wanted.items())
            )

        return [n for n in self.walk()[1:] if ok(n)]

    def one(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Node:
        found = self.find_all(tag, cls, **attrs)
        assert len(found) == 1, f"expected one <{tag} class={cls} {attrs}>, found {len(found)}"
        return found[0]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(text: str) -> Node:
    builder = _Builder()
    builder.feed(text)
    builder.close()
    return builder.root
