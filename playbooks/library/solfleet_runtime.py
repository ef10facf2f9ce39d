#!/usr/bin/python
"""solfleet_runtime: unpack a pushed wheelhouse and build runtimes/<stack-id> from it, with no registry."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.solfleet_artifact import node_stack, requirements_of, stack_difference
from ansible.module_utils.solfleet_kernels import kernels_env

DOCUMENTATION = r"""
module: solfleet_runtime
short_description: Build the pinned Python runtime of a stack from a pushed wheelhouse
description:
  - >-
    Unpacks I(archive) into C(<root>/wheelhouses/<stack_id>/) once (every wheel checked against the
    wheelhouse MANIFEST.json), then makes C(<root>/runtimes/<stack_id>) with C(<base_python> -m venv
    --without-pip) and C(pip install --no-index --require-hashes --no-deps) from the wheelhouse's lock; pip
    itself runs from the wheel the wheelhouse carries, so the node needs neither a registry nor ensurepip.
  - >-
    I(mode=layered) also puts the base interpreter's site-packages after the runtime's own on sys.path
    (a .pth file), so an image that already holds most of the stack only needs the carried wheels.
  - >-
    Either way the runtime's versions are then checked against I(expected) in the clean environment verify
    uses, and the first differing field fails the task. Idempotent: a runtime whose stamp names the same
    lock is not rebuilt (changed=false), only re-checked. Supports check mode.
options:
  root: {description: "absolute node root", type: path, required: true}
  node: {description: "node name, for messages", type: str, required: true}
  stack_id: {description: "the stack id (names the runtime and the wheelhouse)", type: str, required: true}
  mode: {description: "venv or layered", type: str, choices: [venv, layered], default: venv}
  base_python: {description: "interpreter the runtime is made from (and layered on)", type: path,
                required: true}
  archive: {description: "pushed wheelhouse tarball on the node", type: path, required: true}
  expected: {description: "the stack as recorded in manifests (pins + requirements)", type: dict,
             required: true}
  simulated: {description: "node declared simulated", type: bool, default: false}
  timeout_s: {description: "limit of the venv and pip steps", type: int, default: 900}
"""

STAMP = "solfleet-runtime.json"
LAYER_PTH = "solfleet-layer.pth"


class RuntimeError_(Exception):
    pass


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack(archive: str, dest_parent: str, stack_id: str) -> None:
    if not os.path.isfile(archive):
        raise RuntimeError_(f"wheelhouse archive {archive} is missing (was it pushed?)")
    tmp = os.path.join(dest_parent, stack_id + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with tarfile.open(archive, "r:*") as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if (
                m.name.startswith("/")
                or ".." in parts
                or parts[0] != stack_id
                or not (m.isfile() or m.isdir())
            ):
                raise RuntimeError_(
                    f"wheelhouse member {m.name!r} refused (outside {stack_id}/ or not a file)"
                )
        for m in tar.getmembers():
            rel = "/".join(m.name.split("/")[1:])
            target = os.path.join(tmp, rel) if rel else tmp
            if m.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            src = tar.extractfile(m)
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out)
    manifest = read_manifest(tmp)
    for name, digest in manifest["files"].items():
        if sha256_file(os.path.join(tmp, name)) != digest:
            raise RuntimeError_(f"wheelhouse file {name} does not match its MANIFEST sha256")
    final = os.path.join(dest_parent, stack_id)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)


def read_manifest(wheelhouse: str) -> dict:
    try:
        with open(os.path.join(wheelhouse, "MANIFEST.json"), encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RuntimeError_(f"wheelhouse MANIFEST.json unreadable: {exc}") from None
    if manifest.get("kind") != "wheelhouse" or not isinstance(manifest.get("files"), dict):
        raise RuntimeError_("wheelhouse MANIFEST.json is not a solfleet wheelhouse manifest")
    return manifest


def run(argv: list, env: dict, timeout_s: int, what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError_(f"{what}: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise RuntimeError_(f"{what} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")
    return proc.stdout


def build(p: dict, runtime: str, wheelhouse: str, manifest: dict, env: dict) -> None:
    shutil.rmtree(runtime, ignore_errors=True)
    os.makedirs(os.path.dirname(runtime), exist_ok=True)
    run([p["base_python"], "-m", "venv", "--without-pip", runtime], env, p["timeout_s"], "python -m venv")
    python = os.path.join(runtime, "bin", "python")
    purelib = run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env, 60, "runtime python"
    ).strip()
    if p["mode"] == "layered":
        base = json.loads(
            run(
                [
                    p["base_python"],
                    "-c",
                    "import json, site, sys; print(json.dumps([sys.prefix, site.getsitepackages()]))",
                ],
                env,
                60,
                "base python",
            )
        )
        prefix, layers = base[0], [d for d in base[1] if os.path.isdir(d) and d != purelib]
        # addsitedir appends (after this runtime's own packages) and reads the layer's .pth files; PREFIXES
        # makes site.getsitepackages() list the layer too, which is where cuda.pathfinder looks for the
        # NVIDIA wheels' libraries (nvrtc, nvvm, nvjitlink)
        lines = [
            f"import site; site.addsitedir({d!r});"
            f" {prefix!r} in site.PREFIXES or site.PREFIXES.append({prefix!r})"
            for d in layers
        ]
        with open(os.path.join(purelib, LAYER_PTH), "w", encoding="utf-8") as fh:
            fh.write(
                "# solfleet layered runtime: the base interpreter's packages, after this runtime's own\n"
            )
            fh.write("\n".join(lines) + "\n")
    lock = os.path.join(wheelhouse, manifest["lock"])
    with open(lock, encoding="utf-8") as fh:
        has_reqs = any(ln.strip() and not ln.startswith("#") for ln in fh)
    if has_reqs:
        pip = os.path.join(wheelhouse, manifest["installer"], "pip")
        run(
            [
                python,
                pip,
                "install",
                "--no-index",
                "--no-deps",
                "--require-hashes",
                "--ignore-installed",
                "--disable-pip-version-check",
                "--no-cache-dir",
                "--no-warn-script-location",
                "--find-links",
                wheelhouse,
                "-r",
                lock,
            ],
            {**env, "PIP_NO_INPUT": "1"},
            p["timeout_s"],
            "pip install --no-index --require-hashes",
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "node": {"type": "str", "required": True},
            "stack_id": {"type": "str", "required": True},
            "mode": {"type": "str", "choices": ["venv", "layered"], "default": "venv"},
            "base_python": {"type": "path", "required": True},
            "archive": {"type": "path", "required": True},
            "expected": {"type": "dict", "required": True},
            "simulated": {"type": "bool", "default": False},
            "timeout_s": {"type": "int", "default": 900},
        },
        supports_check_mode=True,
    )
    p = module.params
    root, sid = p["root"], p["stack_id"]
    wheelhouses = os.path.join(root, "wheelhouses")
    wheelhouse = os.path.join(wheelhouses, sid)
    runtime = os.path.join(root, "runtimes", sid)
    python = os.path.join(runtime, "bin", "python")
    cache = os.path.join(root, "cache")
    env = kernels_env(None, cache, False)
    out = {"stack_id": sid, "mode": p["mode"], "python": python, "steps": []}
    try:
        if not os.path.isfile(os.path.join(wheelhouse, "MANIFEST.json")):
            out["steps"].append("unpack wheelhouse")
            if module.check_mode:
                module.exit_json(changed=True, solfleet={"runtime": out}, runtime=out)
            os.makedirs(wheelhouses, exist_ok=True)
            unpack(p["archive"], wheelhouses, sid)
        manifest = read_manifest(wheelhouse)
        if manifest.get("stack_id") != sid:
            raise RuntimeError_(f"wheelhouse is for stack {manifest.get('stack_id')}, not {sid}")
        stamp = {}
        try:
            with open(os.path.join(runtime, STAMP), encoding="utf-8") as fh:
                stamp = json.load(fh)
        except (OSError, ValueError):
            stamp = {}
        current = (
            stamp.get("lock_sha256") == manifest.get("lock_sha256")
            and stamp.get("mode") == p["mode"]
            and os.access(python, os.X_OK)
        )
        if not current:
            out["steps"].append("build runtime")
            if module.check_mode:
                module.exit_json(changed=True, solfleet={"runtime": out}, runtime=out)
            os.makedirs(cache, exist_ok=True)
            build(p, runtime, wheelhouse, manifest, env)
        try:
            versions = node_stack(
                python,
                120,
                cache_dir=cache,
                simulated=p["simulated"],
                requirements=requirements_of(p["expected"]),
            )
        except Exception as exc:  # NodeError: one line already
            raise RuntimeError_(getattr(exc, "message", str(exc))) from None
        out["versions"] = versions
        why = stack_difference(p["expected"], versions)
        if why:
            raise RuntimeError_(f"runtime {python} does not match the stack: {why}")
        if not current:
            with open(os.path.join(runtime, STAMP + ".tmp"), "w", encoding="utf-8") as fh:
                json.dump(
                    {
                        "stack_id": sid,
                        "mode": p["mode"],
                        "lock_sha256": manifest.get("lock_sha256"),
                        "versions": versions,
                    },
                    fh,
                    sort_keys=True,
                    indent=1,
                )
            os.replace(os.path.join(runtime, STAMP + ".tmp"), os.path.join(runtime, STAMP))
    except RuntimeError_ as exc:
        module.fail_json(msg=f"solfleet: {p['node']}: runtime: {exc}", solfleet={"runtime": out})
    module.exit_json(changed=not current, solfleet={"runtime": out}, runtime=out)


if __name__ == "__main__":
    main()
