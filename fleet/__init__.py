"""solfleet controller: fleet spec, inventory rendering, artifact build, rollout planning, the ansible-runner
driver, the deployment ledger and the `solfleet` CLI."""
