"""Role argument specs, checked on the controller once per run instead of once per host by Ansible.

A role with `meta/argument_specs.yml` gets a task prepended by Ansible ("Validating arguments against arg
spec ...") that runs on every host of every play that imports it: one more host-task per host per run, a
worker fork and the templating of every role variable each time. Measured through the CLI at 16 sshd nodes:
9.3 -> 7.7-8.0 s of controller CPU per deploy (docs/playbooks.md, "Speed"), for a check whose inputs the
controller rendered itself from a validated spec.

So the controller's playbooks import the solfleet role with `rolespec_validate: false`, and before each run
this module checks the same thing with the same code: Ansible's own `ArgumentSpecValidator`, the one its
`validate_argument_spec` action uses, over each limited host's variables as the run will see them (the
role's defaults, then the rendered inventory's group and host vars, then the run's extravars). A playbook
that leaves Ansible's validation on is left to it; one that turns it off gets this check. A mismatch is a
controller bug (the spec was validated before anything was rendered), so nothing runs and the error names
the playbook, the entry point, the host and what is wrong.

The inventory is the one fleet/inventory.py renders (a YAML `hosts.yml`, strings tagged `!unsafe`); any
other file in the inventory dir is refused rather than silently left out of the check."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from fleet.errors import RunnerError

IMPORT_ROLE = ("ansible.builtin.import_role", "import_role", "ansible.builtin.include_role", "include_role")


class _InventoryLoader(yaml.SafeLoader):
    """YAML with Ansible's `!unsafe` tag read as the plain string it marks (never templated either way)."""


_InventoryLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))  # type: ignore[arg-type]


def unvalidated_imports(playbook: Path) -> Iterator[tuple[str, str]]:
    """(role, entry point) of every role task in `playbook` that turns Ansible's own validation off."""
    plays = yaml.safe_load(playbook.read_text(encoding="utf-8")) or []
    for play in plays:
        for section in ("pre_tasks", "tasks", "post_tasks"):
            for task in play.get(section) or []:
                for key in IMPORT_ROLE:
                    args = task.get(key)
                    if isinstance(args, Mapping) and args.get("rolespec_validate") is False:
                        yield str(args["name"]), str(args.get("tasks_from", "main"))


def host_vars(inventory: Path) -> dict[str, dict[str, Any]]:
    """Every host's variables in the rendered inventory, in Ansible's order: group vars by group depth
    (`all` first, a child after its parent; groups of one depth by name), then the host's own vars."""
    names = sorted(p.name for p in inventory.iterdir())
    if names != ["hosts.yml"]:
        raise RunnerError(
            f"{inventory}: holds {', '.join(names) or 'nothing'}; the controller's role check reads only the"
            " hosts.yml that fleet/inventory.py renders"
        )
    data = yaml.load((inventory / "hosts.yml").read_text(encoding="utf-8"), Loader=_InventoryLoader)
    group_vars: dict[str, tuple[int, dict[str, Any]]] = {}
    members: dict[str, set[str]] = {}  # host -> every group it is in, ancestors included
    own: dict[str, dict[str, Any]] = {}

    def walk(name: str, group: Mapping[str, Any] | None, depth: int, ancestors: tuple[str, ...]) -> None:
        group = group or {}
        group_vars[name] = (depth, dict(group.get("vars") or {}))
        for host, hv in (group.get("hosts") or {}).items():
            members.setdefault(host, set()).update((*ancestors, name))
            own[host] = {**own.get(host, {}), **(hv or {})}
        for child, sub in (group.get("children") or {}).items():
            walk(child, sub, depth + 1, (*ancestors, name))

    walk("all", (data or {}).get("all"), 0, ())
    found: dict[str, dict[str, Any]] = {}
    for host, groups in members.items():
        merged: dict[str, Any] = {}
        for group in sorted(groups, key=lambda g: (group_vars[g][0], g)):
            merged.update(group_vars[group][1])
        found[host] = {**merged, **own[host]}
    return found


def check(
    project: Path, playbook: str, inventory: Path, hosts: list[str], extravars: Mapping[str, Any]
) -> None:
    """Raise RunnerError naming the first host whose variables the role's spec refuses; nothing has run."""
    imports = list(unvalidated_imports(project / playbook))
    if not imports:
        return
    per_host = host_vars(inventory)
    for role, entry in imports:
        role_dir = project / "roles" / role
        specs = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text(encoding="utf-8"))
        options = ((specs or {}).get("argument_specs") or {}).get(entry, {}).get("options")
        if options is None:
            raise RunnerError(f"{playbook}: role {role} has no argument spec for entry point {entry!r}")
        defaults_file = role_dir / "defaults" / "main.yml"
        defaults = yaml.safe_load(defaults_file.read_text(encoding="utf-8")) if defaults_file.exists() else {}
        validator = ArgumentSpecValidator(options)
        # a host of the limit that the inventory no longer has (a node removed from the spec, named by a
        # reconcile's baseline) is Ansible's to skip (`not_run`), not a reason to refuse the others' run
        for host in (h for h in hosts if h in per_host):
            seen = {**(defaults or {}), **per_host[host], **extravars}
            result = validator.validate({k: v for k, v in seen.items() if k in options})
            if result.error_messages:
                raise RunnerError(
                    f"{playbook}: host {host}: the role {role}'s variables fail its argument spec"
                    f" (entry point {entry}): {'; '.join(result.error_messages)}; nothing was run"
                )
