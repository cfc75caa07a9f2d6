"""The custom kernels' Python modules: layered without import cycles, each taking only public
names from the others, and importable without torch (config validation imports them)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
KERNELS = SRC / "flashwatt" / "kernels"
# Bottom up: each module may import only those before it (flashwatt.kernels.custom's docstring).
LAYERS = ("custom_inputs", "custom_mask", "custom_variants", "custom_fp8", "custom_forward", "custom_backward",
          "custom_autograd", "custom")


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every import in the file, module level or inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, [], node.lineno) for a in node.names)
    return found


def _custom_module(module: str, names: list[str]) -> list[str]:
    """The custom* modules of flashwatt.kernels an import statement reaches."""
    if module.startswith("flashwatt.kernels.custom"):
        return [module.rsplit(".", 1)[1]]
    if module == "flashwatt.kernels":
        return [n for n in names if n.startswith("custom")]
    return []


def test_every_custom_module_is_in_the_layers():
    assert {p.stem for p in KERNELS.glob("custom*.py")} == set(LAYERS)


def test_custom_modules_import_only_the_layers_below():
    """No cycle, module level or lazy: every import of a custom* module points down."""
    upward = []
    for i, name in enumerate(LAYERS):
        for module, names, line in _imports(KERNELS / f"{name}.py"):
            for target in _custom_module(module, names):
                if target not in LAYERS[:i]:
                    upward.append(f"{name}.py:{line} imports {target}")
    assert not upward, upward


def test_no_private_name_crosses_a_module():
    """No module of src/ imports a name starting with "_" from a kernels module, nor a
    custom* module from any flashwatt module."""
    private = []
    for path in sorted(SRC.rglob("*.py")):
        custom = path.parent == KERNELS and path.stem in LAYERS
        for module, names, line in _imports(path):
            if module.startswith("flashwatt.kernels") or (custom and module.startswith("flashwatt")):
                private += [f"{path.relative_to(SRC)}:{line} {module}.{n}" for n in names if n.startswith("_")]
    assert not private, private


def test_the_public_surface_imports_without_torch():
    code = ("import sys; import flashwatt.kernels.custom, flashwatt.kernels.custom_backward; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert out.stdout.strip() == "False", out.stdout + out.stderr
