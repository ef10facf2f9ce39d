"""Property tests of the spec loader: arbitrary YAML and mutated valid specs either load or raise the one
exit-2 spec error (one line naming what is wrong), never anything else, and loading writes nothing (so it
cannot touch a node, or even the controller's work dir)."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.errors import ExitCode, UsageError
from fleet.spec import FleetSpec, load_spec, project_root

EXAMPLES = [
    project_root() / "inventory" / "fleets" / "local.yml",
    project_root() / "inventory" / "fleets" / "baremetal.example.yml",
]
BASES = [yaml.safe_load(p.read_text()) for p in EXAMPLES]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "{{ lookup('pipe', 'id') }}",
            "{% if 1 %}x{% endif %}",
            "{# c #}",
            "/x/{{ 7*7 }}",
            "/k/x -o StrictHostKeyChecking=no",
            'a"b',
            "../../etc",
            "/",
            "${NOPE_NOT_SET}",
            "25%",
            "150%",
            "auto",
            "[/]",
            "\x00",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(data, dict):
        for key, item in data.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(data, list):
        for i, item in enumerate(data):
            out += _paths(item, (*prefix, i))
    return out


def _set(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return data


def _load(text: str) -> FleetSpec | None:
    """Load `text` as a spec in a scratch dir; return the spec, or None for the one allowed error."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "fleet.yml"
        spec_file.write_text(text, encoding="utf-8")
        work = Path(tmp) / "work"
        try:
            spec = load_spec(spec_file, work_dir=work)
        except UsageError as exc:
            assert exc.exit_code is ExitCode.USAGE
            message = str(exc)
            assert message and "\n" not in message, repr(message)
            spec = None
        assert not work.exists(), "loading a spec must not write anything"
        return spec


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text_loads_or_fails_with_the_spec_error(text: str) -> None:
    _load(text)


@FUZZ
@given(values)
def test_arbitrary_yaml_loads_or_fails_with_the_spec_error(data: Any) -> None:
    _load(yaml.safe_dump(data))


@FUZZ
@given(st.sampled_from(range(len(BASES))), st.data())
def test_mutated_valid_specs_load_or_fail_with_the_spec_error(base: int, data: st.DataObject) -> None:
    spec = copy.deepcopy(BASES[base])
    path = data.draw(st.sampled_from(_paths(spec)))
    mutated = _set(spec, path, data.draw(values))
    loaded = _load(yaml.safe_dump(mutated))
    if loaded is not None:
        # whatever got through is data: no Jinja2 opener survives into anything Ansible will read
        text = repr(loaded)
        assert "{{" not in text and "{%" not in text and "{#" not in text


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        data = data[key]
    return data


TEMPLATED_LEAVES = [
    (i, path)
    for i, base in enumerate(BASES)
    for path in _paths(base)
    if path and isinstance(_get(base, path), str)
]


@pytest.mark.parametrize(
    ("base", "path"),
    TEMPLATED_LEAVES,
    ids=lambda x: ".".join(map(str, x)) if isinstance(x, tuple) else str(x),
)
@pytest.mark.parametrize("opener", ["{{ 7*7 }}", "{% raw %}", "{# c #}"])
def test_a_template_in_any_string_is_refused_naming_the_field(
    base: int, path: tuple[Any, ...], opener: str
) -> None:
    spec = copy.deepcopy(BASES[base])
    _set(spec, path, f"{_get(spec, path)}{opener}")
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "fleet.yml"
        spec_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
        with pytest.raises(UsageError, match="spec values are data") as caught:
            load_spec(spec_file, work_dir=Path(tmp) / "work")
    field = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[")
    assert field in str(caught.value)
