"""The layer rules of docs/ARCHITECTURE.md §3, read from the source with `ast`: imports point one
way, downwards (an import of a higher layer's module fails, at module level or inside a
function), and the ops own no memory (no module of vkrt/ops allocates device memory, but for the
scratch classes whose purpose that is)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the layers, bottom first: a module may import from its own layer and the ones below it
ORDER = ("bottom", "cpu", "device", "memory", "commands", "pipeline", "ops", "model", "engine", "server", "cli")
# the modules of the bottom layer (vkrt/<name>.py)
BOTTOM = frozenset({"errors", "units", "owned", "settings"})
# the library's front end, vkrt.load (vkrt/__init__.py, vkrt/llm.py), stands on the engine beside
# the server (it renders chat templates with vkrt.server.chat_template): the server's layer
FRONT_END = frozenset({"__init__", "llm"})

# calls that create device memory, by the name called (`allocate(...)`, `device.service(...)`;
# the per-device helpers of service() own memory), and Tensor.empty
ALLOCATING = frozenset({"allocate", "allocator", "alloc", "Buffer", "ImportedBuffer", "AnonymousMemory",
                        "AnonymousRegion", "host_registry", "tensor_from_numpy", "empty_group", "service",
                        "FlashWork", "RouteTable"})
# the scratch classes of vkrt/ops that own memory for their callers (Scratch holds them)
SCRATCH_CLASSES = frozenset({"FlashWork", "RouteTable"})


def sources(root: Path) -> list[Path]:
    return sorted([*(root / "vkrt").rglob("*.py"), *(root / "cli").rglob("*.py")])


def module_of(path: Path, root: Path) -> tuple[str, ...]:
    """The dotted name of a source file as parts (cli/ is the package vkrt.cli); a package's
    __init__ keeps that last part, so relative imports resolve the same way for every file."""
    parts = path.relative_to(root).with_suffix("").parts
    return ("vkrt", *parts) if parts[0] == "cli" else parts


def layer_of(module: tuple[str, ...]) -> str | None:
    """The layer of a vkrt module (None: not vkrt's); an AssertionError for a vkrt module in none."""
    if module[0] != "vkrt":
        return None
    head = module[1] if len(module) > 1 else "__init__"
    if head in BOTTOM:
        return "bottom"
    if head in FRONT_END:
        return "server"
    assert head in ORDER, f"vkrt.{head} is in no layer: add it to tests/test_layers.py's ORDER, BOTTOM or FRONT_END"
    return head


def imports(path: Path, root: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module) of every import in the file, wherever it stands; relative ones resolved."""
    package = module_of(path, root)[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, tuple(alias.name.split("."))) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else ()
            if node.module is None:   # from . import name: the name may be a module
                found += [(node.lineno, (*base, alias.name)) for alias in node.names]
            else:
                found.append((node.lineno, (*base, *node.module.split("."))))
    return found


def upward_imports(root: Path = ROOT) -> list[str]:
    wrong = []
    for path in sources(root):
        importer = layer_of(module_of(path, root))
        for line, module in imports(path, root):
            imported = layer_of(module)
            if imported is not None and ORDER.index(imported) > ORDER.index(importer):
                wrong.append(f"{path.relative_to(root)}:{line}: {importer} imports {'.'.join(module)} ({imported})")
    return wrong


def test_imports_point_downwards():
    wrong = upward_imports()
    assert not wrong, ("imports that point up the layers (docs/ARCHITECTURE.md §3; move the code to the layer "
                       "it belongs to, or pass the value down):\n" + "\n".join(wrong))


def test_the_rule_resolves_every_kind_of_import(tmp_path):
    """Module level, in a function, absolute, relative and `from . import`: each found and placed."""
    (tmp_path / "vkrt" / "memory").mkdir(parents=True)
    path = tmp_path / "vkrt" / "memory" / "probe.py"
    path.write_text("import numpy\nfrom . import buffer\nfrom ..settings import Settings\n"
                    "def f():\n    from ..engine import engine\n    import vkrt.model.loader\n"
                    "    from vkrt import load\n")
    assert [(line, layer_of(m)) for line, m in imports(path, tmp_path)] == [
        (1, None), (2, "memory"), (3, "bottom"), (5, "engine"), (6, "model"), (7, "server")]
    assert upward_imports(tmp_path) == ["vkrt/memory/probe.py:5: memory imports vkrt.engine (engine)",
                                "vkrt/memory/probe.py:6: memory imports vkrt.model.loader (model)",
                                "vkrt/memory/probe.py:7: memory imports vkrt (server)"]


class _Allocations(ast.NodeVisitor):
    """(line, function, call) of every allocating call outside the scratch classes."""

    def __init__(self):
        self.scope: list[str] = []
        self.found: list[tuple[int, str, str]] = []

    def visit_ClassDef(self, node):
        if node.name not in SCRATCH_CLASSES:
            self._inside(node)

    def visit_FunctionDef(self, node):
        self._inside(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _inside(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Call(self, node):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        on_tensor = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "Tensor"
        if name in ALLOCATING or (on_tensor and name == "empty"):
            self.found.append((node.lineno, ".".join(self.scope) or "<module>", name))
        self.generic_visit(node)


def allocations(path: Path) -> list[tuple[int, str, str]]:
    visitor = _Allocations()
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


def test_ops_own_no_memory():
    """An op records over memory its caller allocated (docs/ARCHITECTURE.md §3, the op contract)."""
    wrong = []
    for path in sorted((ROOT / "vkrt" / "ops").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        wrong += [f"{name}:{line}: {function} calls {call}(...)" for line, function, call in allocations(path)]
    assert not wrong, ("ops that allocate device memory (give the op its memory from the caller, or make it a "
                       "scratch class its caller owns):\n" + "\n".join(wrong))


def test_the_memory_rule_sees_allocations():
    code = ("class FlashWork:\n    def range(self):\n        return allocate(self.device, 4)\n"
            "def op(seq, x):\n    t = Tensor.empty(seq.device, F32, (4,))\n    np.empty(4)\n"
            "    w = seq.device.service('w', lambda d: FlashWork(d))\n    return Buffer(seq.device, 16)\n")
    visitor = _Allocations()
    visitor.visit(ast.parse(code))
    assert visitor.found == [(5, "op", "empty"), (7, "op", "service"), (7, "op", "FlashWork"), (8, "op", "Buffer")]
