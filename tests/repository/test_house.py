"""The house rules that keep the project readable: a pure core, folders in layers that import only
downward, adapters that never import each other, and a repository that refers to nothing outside
itself."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

from ..conftest import run_script

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vllm_scene_eplb"
# The pure core: every module of these folders, and these modules, import no engine and no torch.
PURE_FOLDERS = ("layouts", "planning", "live", "hash_layers", "protocol", "formats", "fit", "advise", "client")
PURE = (
    "cli",
    "commands",
    "arrays",
    "terminal",
    "runtime.config",
    "runtime.layout_check",
    "ab.stats",
    "ab.factorial",
    "ab.charts",
    "ab.results",
    "ab.compare",
    "ab.verify",
    "ab.engine_tokens",
    "rig.simulated",
)


def _pure_modules() -> list[str]:
    folders = [
        ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        for folder in PURE_FOLDERS
        for p in sorted((PACKAGE / folder).rglob("*.py"))
    ]
    return [*folders, *PURE]


def test_core_imports_no_engine_and_no_torch():
    assert {"layouts.counts", "planning.memory", "live.fitness", "formats.safetensors"} <= set(_pure_modules())
    proc = run_script("core_imports", *_pure_modules())
    assert proc.returncode == 0, proc.stderr


def _imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved against the package)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return out


@pytest.mark.parametrize("engine, other", [("vllm", "vllm_ascend"), ("vllm_ascend", "vllm")])
def test_engine_adapters_never_import_each_other(engine, other):
    bad = {}
    for path in (PACKAGE / "adapters" / engine).rglob("*.py"):
        hits = [
            m
            for m in _imports(path)
            if m == f"vllm_scene_eplb.adapters.{other}" or m.startswith(f"vllm_scene_eplb.adapters.{other}.")
        ]
        if hits:
            bad[str(path.relative_to(REPO))] = hits
    assert not bad, bad


def test_only_adapters_import_engines():
    engines = ("vllm", "vllm_ascend", "torch_npu")
    bad = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).parts
        if rel[0] == "adapters" or rel[:2] in (("ab", "bench.py"), ("rig", "local_server.py")):
            continue
        hits = [m for m in _imports(path) if m.split(".")[0] in engines]
        if hits:
            bad[str(path.relative_to(REPO))] = hits
    assert not bad, bad


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    here = Path(__file__).resolve()  # this file spells the patterns it looks for
    return [REPO / f for f in out if not f.endswith(".json") and (REPO / f).is_file() and REPO / f != here]


OUTSIDE = re.compile(r"\.\./shared|shared/(?:SPEC|data|reference|seeds|hooks)|/work/|\.\./\.library")


def test_no_file_refers_to_anything_outside_the_repository():
    assert _tracked_text_files(), "git ls-files found nothing: run the tests from a clone"
    bad = []
    for path in _tracked_text_files():
        text = path.read_text(errors="replace")
        bad += [f"{path.relative_to(REPO)}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
        if path.suffix == ".md":
            for link in re.findall(r"\]\(([^)#\s]+)", text):
                if "://" in link:
                    continue
                target = (path.parent / link).resolve()
                if REPO not in target.parents and target != REPO or not target.exists():
                    bad.append(f"{path.relative_to(REPO)}: link {link}")
    assert not bad, bad


def test_sample_data_ships_with_its_provenance():
    data = REPO / "data" / "deepseek_v3_counts"
    names = sorted(p.name for p in data.glob("*.json"))
    assert names == ["decode_in1000out1000.json", "prefill_in1024.json", "prefill_in4096.json"]
    note = (REPO / "data" / "README.md").read_text()
    assert all(n in note for n in names) and "SGLang" in note and "DeepSeek-V3" in note


def _module_graph() -> dict[str, set[str]]:
    """Package module -> the package modules it imports (at module level or inside a function),
    leaving out its own parent packages (Python imports those first, whatever the code says)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        deps = set()
        for imported in _imports(path):
            parts = imported.split(".")
            target = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)
            if target and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_anywhere_in_the_package():
    """Imports run one way (lazy ones inside functions included): a cycle means two modules that
    cannot be read, tested or changed apart."""
    graph = _module_graph()
    assert (
        len(graph) > 80
        and "vllm_scene_eplb.adapters.vllm_ascend.worker_plugin" in graph["vllm_scene_eplb.adapters.vllm_ascend.startup"]
    )
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The house from the ground up (docs/code-layout.md): a module imports its own folder or a lower row,
# never a sibling folder of its row, never a higher row (lazy imports inside functions count).
# The package root's shared utilities are one folder, "(root)"; cli is a row of its own, above the
# commands it dispatches to; runtime/worker and runtime/server (the two processes) both stand on
# runtime/ top and never import each other.
LAYERS = (
    ("(root)",),
    ("protocol", "layouts"),
    ("planning", "formats", "fit", "live"),
    ("advise", "hash_layers"),
    ("client",),
    ("ab",),
    ("runtime",),
    ("runtime.worker", "runtime.server"),
    ("adapters", "rig"),
    ("commands",),
    ("cli",),
)


def _folder(module: str, layers=LAYERS) -> str:
    """The row entry a package module belongs to: its first folder (``runtime``'s two processes
    apart), ``(root)`` for the package root's modules but cli."""
    parts = module.split(".")[1:]
    named = {name for row in layers for name in row}
    if parts[:1] == ["runtime"] and len(parts) > 1 and parts[1] in ("worker", "server"):
        return f"runtime.{parts[1]}"
    if not parts or len(parts) == 1 and parts[0] not in named:
        return "(root)"
    return parts[0]


def _layer_breaches(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import of ``graph`` that goes to a sibling folder of its row or up to a higher row, and
    every folder the table does not place."""
    row = {name: i for i, names in enumerate(layers) for name in names}
    bad = []
    for module, deps in sorted(graph.items()):
        here = _folder(module, layers)
        for dep in sorted(deps):
            there = _folder(dep, layers)
            if here == there:
                continue
            if here not in row or there not in row:
                bad.append(f"{module} -> {dep}: {here if here not in row else there} has no row")
            elif row[there] == row[here]:
                bad.append(f"{module} -> {dep}: a sibling folder of the same row")
            elif row[there] > row[here]:
                bad.append(f"{module} -> {dep}: up from {here} to {there}")
    return bad


def test_every_import_runs_down_the_layers():
    graph = _module_graph()
    assert {_folder(m) for m in graph} == {name for row in LAYERS for name in row}
    assert _layer_breaches(graph) == []


def test_only_the_rig_imports_the_rig():
    """The engine rig (servers, generated models, the simulated server, the demo) serves tests,
    benchmarks and the demo: no product module imports it, commands included."""
    graph = _module_graph()
    bad = [f"{m} -> {d}" for m, deps in graph.items() for d in deps if _folder(d) == "rig" and _folder(m) != "rig"]
    assert not bad, bad


@pytest.mark.parametrize(
    "edge, breach",
    [
        (("vllm_scene_eplb.layouts.counts", "vllm_scene_eplb.planning.memory"), "up from layouts to planning"),
        (("vllm_scene_eplb.fit.layout_fit", "vllm_scene_eplb.live.fitness"), "a sibling folder of the same row"),
        (("vllm_scene_eplb.runtime.worker.observer", "vllm_scene_eplb.runtime.server.fanout"), "a sibling folder"),
        (("vllm_scene_eplb.errors", "vllm_scene_eplb.cli"), "up from (root) to cli"),
        (("vllm_scene_eplb.layouts.counts", "vllm_scene_eplb.attic.old"), "attic has no row"),
    ],
    ids=["upward", "sibling", "worker to server", "root to cli", "unplaced folder"],
)
def test_the_layer_check_refuses_a_planted_breach(edge, breach):
    module, dep = edge
    bad = _layer_breaches({module: {dep}, dep: set()})
    assert len(bad) == 1 and breach in bad[0], bad


def test_the_layer_check_passes_imports_down_and_within_a_folder():
    graph = {
        "vllm_scene_eplb.planning.memory": {"vllm_scene_eplb.layouts.layout", "vllm_scene_eplb.errors"},
        "vllm_scene_eplb.layouts.layout": {"vllm_scene_eplb.layouts.score"},
        "vllm_scene_eplb.runtime.server.fanout": {"vllm_scene_eplb.runtime.config", "vllm_scene_eplb.protocol"},
        "vllm_scene_eplb.cli": {"vllm_scene_eplb.commands"},
    }
    assert _layer_breaches(graph) == []


SOURCE_LINE = re.compile(r"^\s*(?:from\s+[\w.]+\s+)?import\s+[\w.]", re.M)


def _python_in_strings(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` where Python source sits in a string, out of ruff's and mypy's sight: a command
    that runs ``sys.executable -c``, or a string (not a docstring) with an import statement on a line."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)):
            python = any(isinstance(e, ast.Attribute) and e.attr == "executable" for e in node.elts)
            if python and any(isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts):
                hits.append(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if "\n" in node.value and SOURCE_LINE.search(node.value):
                hits.append(node.lineno)
    return hits


def test_no_test_keeps_python_source_in_a_string():
    """Code a test runs in another process lives in ``tests/scripts/*.py`` (run by path), where ruff
    and mypy check it like the package, not in strings they never see."""
    here = Path(__file__).resolve()  # this file spells what it looks for
    paths = [p for where in ("tests", "benchmarks", "scripts") for p in sorted((REPO / where).rglob("*.py")) if p != here]
    assert len(paths) > 40 and REPO / "tests" / "scripts" / "ascend_record.py" in paths
    bad = [f"{p.relative_to(REPO)}:{line}" for p in paths for line in _python_in_strings(ast.parse(p.read_text()))]
    assert not bad, bad


@pytest.mark.parametrize(
    "source",
    [
        'subprocess.run([sys.executable, "-c", code])',
        'SCRIPT = """\nimport json\nprint(json.dumps({}))\n"""',
        'run("from vllm.config import VllmConfig\\nVllmConfig()")',
    ],
    ids=["python -c", "a script in a constant", "a script passed on"],
)
def test_the_string_script_finder_finds_one(source):
    assert _python_in_strings(ast.parse(source))


def test_the_string_script_finder_spares_docstrings_and_other_commands():
    source = '"""Docs.\n\nimport x\n"""\n\ndef f():\n    """Also\nimport y\n"""\n    subprocess.run(["bash", "-c", "echo import x\\n"])\n'
    assert _python_in_strings(ast.parse(source)) == []
