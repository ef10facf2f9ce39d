"""Lookup `solfleet_artifact_b64`: a controller file's bytes as base64 text, so the node module can take the
artifact in its own arguments (one pipelined SSH command per host for push + unpack + check + verify +
activate) instead of a `copy` task (about six SSH round trips per host: home dir, temp dir, stat, sftp put,
chmod, copy, cleanup). `ansible.builtin.file` reads text only; an artifact is a gzip tarball."""

from __future__ import annotations

import base64

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


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):  # type: ignore[no-untyped-def]
        out = []
        for term in terms:
            try:
                with open(str(term), "rb") as fh:
                    out.append(base64.b64encode(fh.read()).decode("ascii"))
            except OSError as exc:
                raise AnsibleError(f"solfleet_artifact_b64: cannot read {term}: {exc}") from None
        return out
