"""Lookup `solfleet_artifact_b64`: a controller file's bytes as base64 text, so the node module can take the
artifact in its own arguments (one pipelined SSH command per host for push + unpack + check + verify +
activate) instead of a `copy` task (about six SSH round trips per host: home dir, temp dir, stat, sftp put,
chmod, copy, cleanup). `ansible.builtin.file` reads text only; an artifact is a gzip tarball."""

from __future__ import annotations

import base64
import os

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: solfleet_artifact_b64
short_description: base64 of a controller file (the solfleet artifact tarball)
description:
  - Returns the base64 text of each controller path given. Read on the controller, never on a node.
options:
  _terms: {description: "absolute controller paths", required: true}
"""


# Each fork holds a few copies of the bytes while it builds the module's arguments; an operator library
# artifact is well under a megabyte. Past this, say so rather than exhaust the controller's memory.
MAX_BYTES = 256 * 1024 * 1024


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):  # type: ignore[no-untyped-def]
        out = []
        for term in terms:
            try:
                size = os.path.getsize(str(term))
                if size > MAX_BYTES:
                    raise AnsibleError(
                        f"solfleet_artifact_b64: {term} is {size} bytes, more than the {MAX_BYTES} an"
                        " artifact may have (it travels in the node module's arguments)"
                    )
                with open(str(term), "rb") as fh:
                    out.append(base64.b64encode(fh.read()).decode("ascii"))
            except OSError as exc:
                raise AnsibleError(f"solfleet_artifact_b64: cannot read {term}: {exc}") from None
        return out
