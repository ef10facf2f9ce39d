"""Every node module's DOCUMENTATION is YAML (what `ansible-doc` reads: four of the six once held a plain
scalar with ": " in it, which no YAML parser takes) and names exactly the options its argument_spec takes,
with the same type where the spec states one as a literal."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

LIBRARY = Path(__file__).resolve().parents[2] / "playbooks" / "library"
MODULES = sorted(p.name for p in LIBRARY.glob("solfleet_*.py"))


def _doc_and_spec(path: Path) -> tuple[str, ast.Dict]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    named = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)]
    doc = next(ast.literal_eval(n.value) for n in named if getattr(n.targets[0], "id", "") == "DOCUMENTATION")
    spec = next(k.value for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg == "argument_spec")
    assert isinstance(spec, ast.Dict), f"{path.name}: argument_spec is not a dict literal"
    return doc, spec


def _literal_type(entry: ast.expr) -> Any:
    if isinstance(entry, ast.Dict):
        for k, v in zip(entry.keys, entry.values, strict=True):
            if isinstance(k, ast.Constant) and k.value == "type" and isinstance(v, ast.Constant):
                return v.value
    return None


def test_every_module_is_checked() -> None:
    assert len(MODULES) == 6, MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_documentation_is_yaml_naming_its_options(name: str) -> None:
    text, spec = _doc_and_spec(LIBRARY / name)
    doc = yaml.safe_load(text)
    assert doc["module"] == name.removesuffix(".py")
    assert isinstance(doc["short_description"], str) and doc["short_description"]
    assert doc["description"] and all(isinstance(b, str) and b for b in doc["description"])
    options = doc["options"]
    keys = {k.value: v for k, v in zip(spec.keys, spec.values, strict=True) if isinstance(k, ast.Constant)}
    assert set(options) == set(keys), (name, sorted(set(options) ^ set(keys)))
    for opt, entry in keys.items():
        assert options[opt].get("description"), (name, opt)
        want = _literal_type(entry)
        if want is not None:
            assert options[opt].get("type") == want, (name, opt, options[opt].get("type"), want)
