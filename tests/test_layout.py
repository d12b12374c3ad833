"""The repository's layout holds: the engine core never loads tooling (training, benchmarks)
or the UI, engine modules import each other one way (no cycle), and every measurement under
benchmarks/ names the command that made it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"
TOOLING = ("engine.bench", "engine.train", "engine.prompts")  # packages and modules
FORBIDDEN = (*TOOLING, "textual", "dflash_tui")
# Command-line entry points load tooling on demand; they are not the core.
ENTRY_POINTS = {"engine.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ENGINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ENGINE.rglob("*.py"))}


def is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def core_modules() -> list[str]:
    return [m for m in engine_modules()
            if not is_under(m, TOOLING) and m not in ENTRY_POINTS and ".drafts" not in m]


def imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports anywhere in its file (function-level imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            mod = node.module or ""
            target = (f"{base}.{mod}" if mod else base) if node.level else mod
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}  # `from . import device`
    # Importing a.b.c first runs the packages a and a.b: those are imported too.
    return found | {".".join(m.split(".")[:i]) for m in found for i in range(1, m.count(".") + 1)}


def test_core_modules_load_no_tooling_and_no_textual():
    core = core_modules()
    assert {"engine.runtime", "engine.cycle", "engine.targets", "engine.kernels",
            "engine.config", "engine.device"} <= set(core)
    code = (f"import importlib, json, sys\nfor m in {core!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ENGINE.parent, check=True)
    loaded = json.loads(run.stdout)
    assert "engine.runtime" in loaded
    assert [m for m in loaded if is_under(m, FORBIDDEN)] == []


def test_core_sources_never_import_tooling_even_lazily():
    modules = engine_modules()
    for name in core_modules():
        bad = sorted(m for m in imports(name, modules[name]) if is_under(m, FORBIDDEN))
        assert bad == [], f"{name} imports {bad}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in `graph` (as a list of nodes, first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_engine_modules_import_one_way():
    """No cycle among engine modules, counting imports inside functions too and the packages
    an import runs on the way. A module's own parent packages do not count (Python loads them
    before the module: `from . import x`), nor does the package `engine`, whose lazy
    __getattr__ hands out DFlashRuntime."""
    modules = engine_modules()

    def parents(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    graph = {name: {m for m in imports(name, path) if m in modules}
             - parents(name) - {name, "engine"}
             for name, path in modules.items() if name != "engine"}
    assert find_cycle(graph) is None, find_cycle(graph)


def test_every_benchmark_file_names_its_command():
    """Measurements are reproducible: each file under benchmarks/ carries its command line
    (`command`, or `script` for the kernel checks) or benchmarks/README.md names it, and none
    carries hand-written keys the tools never write."""
    bench = ENGINE.parent / "benchmarks"
    readme = (bench / "README.md").read_text()
    for path in sorted(p for p in bench.rglob("*") if p.is_file() and p.name != "README.md"):
        rel = path.relative_to(bench).as_posix()
        named = rel in readme or (path.name.startswith("train-smollm2")
                                  and "train-smollm2" in readme)
        if path.suffix == ".json":
            report = json.loads(path.read_text())
            assert not {"annotation", "warmed_kernels"} & set(report), rel
            assert named or "command" in report or "script" in report, rel
        else:
            assert named, rel


def test_ui_facing_modules_load_no_mlx():
    """What a UI may import on its main thread: settings, events, errors, the registry."""
    light = ["engine", "engine.config", "engine.events", "engine.errors", "engine.registry"]
    code = (f"import importlib, json, sys\nfor m in {light!r}:\n    importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ENGINE.parent, check=True)
    assert [m for m in json.loads(run.stdout) if is_under(m, ("mlx", "mlx_lm"))] == []

