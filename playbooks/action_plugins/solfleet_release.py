"""Action plugin of `solfleet_release`: the push. On the controller it reads the artifact named by
`artifact_src` and hands its bytes (base64) to the node module in the module's own arguments, so one
pipelined SSH command per host does push + unpack + check + verify + activate, instead of a `copy` task
(about six SSH round trips per host: home dir, temp dir, stat, sftp put, chmod, copy, cleanup).

The bytes go into the arguments of this one module call only, never into the task's own arguments: a task's
arguments travel back with every result from Ansible's per-host worker to its parent, and half a megabyte
there blocks a worker whose parent died on a full pipe that its sibling workers keep open."""

from __future__ import annotations

import base64
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# Each worker holds a few copies of the bytes while it builds the module's arguments; an operator-library
# artifact is well under a megabyte. Past this, say so rather than exhaust the controller's memory.
MAX_BYTES = 256 * 1024 * 1024


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):  # type: ignore[no-untyped-def]
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        src = args.pop("artifact_src", None)
        if src:
            try:
                size = os.path.getsize(str(src))
                if size > MAX_BYTES:
                    raise AnsibleActionFail(
                        f"solfleet: artifact {src} is {size} bytes, more than the {MAX_BYTES} an artifact may"
                        " have (it travels in the node module's arguments)"
                    )
                with open(str(src), "rb") as fh:
                    args["artifact_b64"] = base64.b64encode(fh.read()).decode("ascii")
            except OSError as exc:
                why = f"solfleet: cannot read the artifact {src} on the controller: {exc}"
                raise AnsibleActionFail(why) from None
        result.update(
            self._execute_module(module_name="solfleet_release", module_args=args, task_vars=task_vars)
        )
        return result
