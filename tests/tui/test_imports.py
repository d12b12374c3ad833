"""dflash_tui's modules import each other one way: the app imports its screens, screens reach
the app through dflash_tui.host and messages, and no import circle can come back."""

from __future__ import annotations

from pathlib import Path

from test_layout import find_cycle, imports

PACKAGE = Path(__file__).resolve().parents[2] / "dflash_tui"


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file: inside functions and
    under TYPE_CHECKING too (a circle there is still a circle to a reader and to tools)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {name: {m for m in imports(name, path) if m in modules} - {name}
            for name, path in modules.items()}


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path: Path):
    package = tmp_path / "pkg"
    (package / "screens").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "screens" / "__init__.py").write_text("")
    (package / "app.py").write_text("from pkg.screens.chat import ChatScreen\n")
    (package / "screens" / "chat.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.app import App\n"
    )
    assert find_cycle(import_graph(package)) == ["pkg.app", "pkg.screens.chat", "pkg.app"]
    (package / "screens" / "chat.py").write_text("def f():\n    from pkg import app\n")
    assert find_cycle(import_graph(package)) == ["pkg.app", "pkg.screens.chat", "pkg.app"]
    (package / "screens" / "chat.py").write_text("from pkg import messages\n")
    assert find_cycle(import_graph(package)) is None


def test_dflash_tui_has_no_import_circle():
    graph = import_graph(PACKAGE)
    assert "dflash_tui.screens.chat" in graph["dflash_tui.app"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])
