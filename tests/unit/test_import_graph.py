"""The package import graph points one way: no cycle between sub-packages (lazy imports inside
functions count too), and the engine never imports the simulator.

The rules, as the design notes give them (they live beside the checkout, not in the repository):

    flexlamps.cli ──> flexlamps.{engine, sched, evals, models, io}
    flexlamps.engine ──> offload, quant, placement, flexlamps.models
    offload ──> quant            placement ──> (numpy, scipy only)

"`import placement` must not import torch: it is a pure planning library (numpy/scipy). `offload`
and `quant` know nothing of models or scheduling." Function-level imports are counted and
justified in test_function_level_imports.py."""

import ast
from collections import defaultdict

from tests.conftest import REPO

TOP = ("placement", "quant", "offload")


def _package(module: str) -> str:
    """flexlamps.engine.executors.x -> flexlamps.engine; quant.fp8 -> quant."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "flexlamps" else parts[0]


def _graph() -> dict[str, set[str]]:
    edges = defaultdict(set)
    for root in ("flexlamps", *TOP):
        for path in (REPO / root).rglob("*.py"):
            source = _package(".".join(path.relative_to(REPO).with_suffix("").parts))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [node.module]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                for t in map(_package, targets):
                    if t != source and (t.startswith("flexlamps.") or t in TOP):
                        edges[source].add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle_between_packages():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_engine_does_not_import_the_simulator():
    assert "flexlamps.sim" not in _graph()["flexlamps.engine"]


def test_planning_sits_between_the_run_plan_and_the_engine():
    """flexlamps.planning (the policy choice, the dry run) reads the engine's charges; the engine
    never reads it back."""
    graph = _graph()
    assert "flexlamps.engine" in graph["flexlamps.planning"]
    assert "flexlamps.planning" not in graph["flexlamps.engine"]


def test_quant_offload_and_placement_know_nothing_of_flexlamps():
    """quant and offload know nothing of models (nor of anything else in flexlamps); placement takes
    numpy and scipy only (the rules in this module's docstring)."""
    graph = _graph()
    assert {top: sorted(t for t in graph[top] if t.startswith("flexlamps")) for top in TOP} == {t: [] for t in TOP}


def test_the_kernels_import_only_quant_and_the_cache_folder():
    """flexlamps.kernels (every C kernel and its loader) sits below the models and the engine."""
    assert _graph()["flexlamps.kernels"] <= {"quant", "flexlamps.cache_folder"}


def test_the_hardware_profile_is_its_own_sub_package():
    assert not list((REPO / "flexlamps").glob("hw_profile*.py"))
    assert {"flexlamps.hardware"} <= set(_graph())


# what the commands may import of the layers below the Python API, and why (nothing else)
BELOW_THE_API = ("flexlamps.engine", "flexlamps.models", "flexlamps.hardware", "flexlamps.kernels", "flexlamps.planning")
COMMANDS_BELOW_THE_API = {
    # --max-rss's arithmetic asks the engine how a dtype's cache is held (its weights: run_plan.build)
    "flexlamps/commands/memory.py": {"flexlamps.engine.caches.dense"},
}


def test_the_commands_call_the_python_api():
    """`flexlamps.commands` reach the engine, the models, the machine's probes, the kernels and the
    planning through the Python API (flexlamps.api, .catalog, .environment, .profiling) only."""
    found = defaultdict(set)
    for path in (REPO / "flexlamps" / "commands").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found[path.relative_to(REPO).as_posix()] |= {m for m in modules if m.startswith(BELOW_THE_API)}
    assert {path: modules for path, modules in found.items() if modules} == COMMANDS_BELOW_THE_API


def test_no_engine_module_imports_or_holds_the_llm_object():
    """The faces take an executor (the contract), never the `LLM` facade above them: flexlamps.engine
    imports nothing of flexlamps.api, and no engine function takes or names an `llm`."""
    assert "flexlamps.api" not in _graph()["flexlamps.engine"]
    holders = []
    for path in (REPO / "flexlamps" / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.arg for a in node.args.args + node.args.kwonlyargs] if isinstance(node, ast.FunctionDef)
                     else [node.id] if isinstance(node, ast.Name) else [])
            holders += [f"{path.relative_to(REPO)}:{node.lineno}" for name in names if name in ("llm", "LLM")]
    assert holders == []
