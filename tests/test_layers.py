"""The layers stay honest: every backend has the same modules, each providing what the
same-named interface module's Protocol lists; the core imports no framework, names none in a
comparison, imports only down the layer order docs/architecture.md gives, and has no import
circle."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import unitrain
from unitrain.interface.modules import available_backends

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "unitrain"
BACKENDS = ROOT / "backends"
#: Modules only one backend has, each explained in docs/architecture.md.
ONE_BACKEND_ONLY = {"attention": "paddle", "blas": "paddle", "elastic_launch": "paddle", "resample": "paddle"}
#: Backend modules the main process loads: they must not import their framework.
FRAMEWORK_FREE = ("launch", "translate", "validation", "weights")


def backend_modules(backend: str) -> set:
    return {p.stem for p in (BACKENDS / backend).glob("*.py") if p.stem != "__init__"}


def protocol_of(name: str) -> type:
    interface = importlib.import_module(f"unitrain.interface.{name}")
    found = [
        c
        for c in vars(interface).values()
        if inspect.isclass(c) and c.__module__ == interface.__name__ and c.__name__.endswith("Module")
    ]
    assert len(found) == 1, f"unitrain/interface/{name}.py should define one Protocol named *Module, found {found}"
    return found[0]


def members(protocol: type) -> dict:
    """Name -> the Protocol's method (a function) or the type its attribute is annotated with."""
    hints = typing.get_type_hints(protocol)
    methods = {n: f for n, f in vars(protocol).items() if inspect.isfunction(f) and not n.startswith("_")}
    return {**{n: hints[n] for n in protocol.__annotations__}, **methods}


def shape(signature: inspect.Signature, drop_self: bool) -> list:
    params = list(signature.parameters.values())[1 if drop_self else 0 :]
    return [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in params]


def test_both_backends_have_the_same_modules():
    paddle, torch = (backend_modules(b) for b in available_backends())
    only = {m: ("paddle" if m in paddle else "torch") for m in paddle ^ torch}
    assert only == ONE_BACKEND_ONLY
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"{m}.py" in architecture for m in ONE_BACKEND_ONLY)


@pytest.mark.parametrize("name", sorted(backend_modules("torch") & backend_modules("paddle")))
def test_each_backend_module_provides_its_protocol_and_nothing_else_in_public(name):
    protocol = protocol_of(name)
    wanted = members(protocol)
    loader = getattr(importlib.import_module(f"unitrain.interface.{name}"), f"{name}_module", None)
    if name != "backend":
        assert loader is not None and typing.get_type_hints(loader)["return"] is protocol
    publics = []
    for backend in available_backends():
        module = importlib.import_module(f"unitrain.backends.{backend}.{name}")
        publics.append(sorted(module.__all__))
        assert set(module.__all__) == set(wanted), f"{backend}/{name}.py: __all__ is not {protocol.__name__}'s members"
        for member, expected in wanted.items():
            value = getattr(module, member)
            if inspect.isfunction(expected):
                assert shape(inspect.signature(value), False) == shape(inspect.signature(expected), True), (
                    f"{backend}/{name}.py: {member}"
                )
            elif typing.get_origin(expected) is type:
                assert issubclass(value, typing.get_args(expected)[0]), f"{backend}/{name}.py: {member}"
            elif typing.get_origin(expected) is typing.Union:  # Optional[...]
                assert isinstance(value, typing.get_args(expected)), f"{backend}/{name}.py: {member}"
            else:
                assert isinstance(value, typing.get_origin(expected) or expected), f"{backend}/{name}.py: {member}"
    assert publics[0] == publics[1]


def core_modules() -> list:
    names = []
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_core_and_the_framework_free_backend_modules_import_no_framework():
    free = [f"unitrain.backends.{b}.{m}" for b in available_backends() for m in FRAMEWORK_FREE]
    code = (
        "import json, sys, importlib\n"
        f"for name in {core_modules() + free!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(m for m in ('paddle', 'torch') if m in sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


#: What a backend may import from the core: the layers below it (a backend sits under interface/,
#: which loads it), and its own package.
BACKEND_MAY_IMPORT = {"interface", "spec", "config", "data", "host", "errors", "backends"}


def core_imports(path: Path) -> set:
    """The core sub-packages (or top-level modules) a file imports, function-local imports too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        found.update(n.split(".")[1] for n in names if n.startswith("unitrain.") and n.count(".") >= 1)
    return found


def test_a_backend_imports_only_downward(tmp_path):
    # The check sees an upward import, also inside a function (what backends/*/ps.py had before
    # the tables moved to spec/).
    upward = tmp_path / "ps.py"
    upward.write_text("def tables():\n    from unitrain.ps.table import SparseTable\n")
    assert core_imports(upward) - BACKEND_MAY_IMPORT == {"ps"}
    wrong = {
        str(path.relative_to(ROOT)): sorted(core_imports(path) - BACKEND_MAY_IMPORT)
        for path in sorted(BACKENDS.rglob("*.py"))
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_core_compares_no_framework_name():
    comparison = re.compile(r"""(==|!=|\bis\b|\bin\b)\s*\(?['"](paddle|torch)['"]|['"](paddle|torch)['"]\s*(==|!=)""")
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in CORE.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if comparison.search(line)
    ]
    assert found == []


def import_graph() -> dict:
    """Module -> the core modules it imports, at module level or inside a function alike."""
    names = set(core_modules())
    graph = {}
    for name in names:
        path = CORE.parent / (name.replace(".", "/") + ".py")
        if not path.exists():
            path = CORE.parent / name.replace(".", "/") / "__init__.py"
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names}
        # Package __init__ modules re-export; only module-to-module edges can close a circle.
        graph[name] = {
            t
            for t in targets
            if t in names and t != name and not (CORE.parent / t.replace(".", "/") / "__init__.py").exists()
        }
    return graph


def test_no_import_circle_in_the_core():
    graph, state, circles = import_graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                circles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert circles == []


#: What Backend hands on to a capability module, for a loop of one's own: the core calls the module.
CONVENIENCES = ("distributed", "precision", "build_optimizer", "set_lr", "make_loader", "tracer")


def test_the_core_reaches_a_backend_module_through_its_loader_only():
    call = re.compile(rf"\bbackend\.({'|'.join(CONVENIENCES)})\(")
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in CORE.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if call.search(line) and not line.lstrip().startswith("#")
    ]
    assert found == []


def test_the_backends_provide_only_what_backend_leaves_abstract():
    from unitrain.interface.backend import Backend, get_backend

    for name in available_backends():
        own = {n for n, v in vars(type(get_backend(name))).items() if callable(v) and not n.startswith("__")}
        assert own - Backend.__abstractmethods__ <= {"describe"}, name


def test_the_kind_of_job_is_read_in_one_place():
    """dist.mode picks a JobKind in jobs/select.py; everything else asks the kind."""

    def reads_mode(node: ast.AST) -> bool:
        if not isinstance(node, ast.Attribute) or node.attr != "mode":
            return False
        owner = node.value
        return (isinstance(owner, ast.Attribute) and owner.attr == "dist") or (
            isinstance(owner, ast.Name) and owner.id == "dist"
        )

    found = sorted(
        str(p.relative_to(ROOT)) for p in CORE.rglob("*.py") if any(map(reads_mode, ast.walk(ast.parse(p.read_text()))))
    )
    assert found == ["unitrain/jobs/select.py"]


def layer_order() -> list:
    """docs/architecture.md's layer order, top first: each row a set of units (a sub-package
    ``name/`` or a top-level module ``name.py``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split(LAYER_MARK, 1)[1].split("```", 2)[1]
    unit = r"[\w]+/|[\w]+\.py"
    rows = []
    for line in block.splitlines():
        found = re.match(rf"^\s*((?:{unit})(?:,\s*(?:{unit}))*)(\s{{2,}}|$)", line)
        if found:
            rows.append({u.strip().rstrip("/").removesuffix(".py") for u in found.group(1).split(",")})
    return rows


#: The line in docs/architecture.md above the block that gives the layer order.
LAYER_MARK = "<!-- the layer order: tests/test_layers.py reads the block below -->"


def unit_of(module: str) -> str:
    """``unitrain.train.trainer`` -> ``train``; ``unitrain.app`` -> ``app``; ``unitrain`` (or a
    name it defines, ``unitrain.__version__``) -> ``__init__``."""
    parts = module.split(".")
    top = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()} | {p.stem for p in CORE.glob("*.py")}
    return parts[1] if len(parts) > 1 and parts[1] in top else "__init__"


def test_the_layer_order_names_every_part_of_the_core_once():
    rows = layer_order()
    named = [u for row in rows for u in row]
    units = {p.name for p in CORE.iterdir() if (p / "__init__.py").exists()} | {p.stem for p in CORE.glob("*.py")}
    assert sorted(named) == sorted(units)


def every_import(path: Path, package: str):
    """(line, imported module) for every import of ``path``, at module level, in a function or
    under TYPE_CHECKING alike."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            yield from ((node.lineno, f"{base}.{a.name}" if base == "unitrain" else base) for a in node.names)


def test_the_core_imports_only_down_the_layer_order():
    """No import up the order (not even inside a function), so no two sub-packages import each
    other; the backends are loaded by name, never imported."""
    rows = layer_order()
    height = {u: len(rows) - i for i, row in enumerate(rows) for u in row}
    upward = []
    for path in sorted(CORE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        source = unit_of(name.removesuffix(".__init__"))
        for line, target in every_import(path, package):
            if target.split(".")[0] != "unitrain" or target == "unitrain" and source == "__init__":
                continue
            if target.startswith("unitrain.backends"):
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target} (backends are loaded by name)")
            elif height[unit_of(target)] > height[source]:
                upward.append(f"{path.relative_to(ROOT)}:{line} {source} imports {target} ({unit_of(target)} is above)")
    assert upward == []


def test_the_top_level_holds_only_the_commands_and_the_public_api():
    top = sorted(p.name for p in CORE.glob("*.py"))
    assert len(top) <= 14, top  # the commands (generate the newest), __init__, errors, registry
    assert unitrain.__all__  # the public API: what `import unitrain` offers a loop of one's own


def hydra_plugins_imports(path: Path, package: str) -> list:
    """(line, module) for each import of ``path`` from the hydra_plugins namespace, function-local too."""
    return [(line, target) for line, target in every_import(path, package) if target.split(".")[0] == "hydra_plugins"]


def test_the_core_imports_nothing_from_hydra_plugins(tmp_path):
    """hydra_plugins/unitrain_sweeper imports unitrain (when a search runs), never the other way:
    the sweeper and its registration stand on the plugin's side."""
    local = tmp_path / "hydra.py"  # the check sees an import inside a function (what launch/hydra.py had)
    local.write_text("def register_sweeper():\n    from hydra_plugins.unitrain_sweeper import OptunaSweeper\n")
    assert hydra_plugins_imports(local, "unitrain.launch") == [(2, "hydra_plugins.unitrain_sweeper")]
    found = []
    for path in sorted(CORE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found += [
            f"{path.relative_to(ROOT)}:{line} imports {target}" for line, target in hydra_plugins_imports(path, package)
        ]
    assert found == []
