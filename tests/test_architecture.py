"""The house's rules that no linter states: the no-CLI import contract names every
module of gateway, every package is installed under ``parley.``, loggers sit under
``parley.*``, and modules stay small enough to read in one sitting. (Layers and
cycles: ``make lint`` runs import-linter; bare ``core``/``gateway``/``channels``
imports: ruff's banned-api.)"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "gateway", "channels")
# "A few hundred lines": past this a module is doing more than one job.
MAX_MODULE_LINES = 650


def product_modules() -> list[Path]:
    return sorted(p for top in PACKAGES for p in (ROOT / top).rglob("*.py"))


def test_the_no_cli_contract_names_every_module_of_gateway_but_the_cli() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c.get("forbidden_modules") == ["parley.gateway.cli"]]
    gateway = ROOT / "gateway"
    children = {
        f"parley.gateway.{p.stem if p.is_file() else p.name}"
        for p in gateway.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert set(contract["source_modules"]) == {"parley.core", "parley.channels"} | (
        children - {"parley.gateway.cli"}
    )


def test_every_package_is_installed_under_the_parley_namespace() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = config["tool"]["setuptools"]
    assert setuptools["package-dir"] == {f"parley.{top}": top for top in PACKAGES}
    packages = {
        "parley." + ".".join(init.parent.relative_to(ROOT).parts)
        for top in PACKAGES
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == packages


@pytest.mark.parametrize("path", product_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_loggers_are_named_under_parley(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = {  # module-level NAME = "literal"
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "logging"
        ):
            [arg] = node.args
            # A literal, so the name does not follow a module move (operators filter on it).
            if isinstance(arg, ast.Name):
                name = constants.get(arg.id)
            else:
                name = arg.value if isinstance(arg, ast.Constant) else None
            assert isinstance(name, str), f"{path}: logger named by an expression"
            assert name == "parley" or name.startswith("parley."), name


def test_no_product_module_is_over_the_size_limit() -> None:
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in product_modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}
