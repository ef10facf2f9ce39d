"""The harness: verify, bench, overhead, roofline and health of the registered ops."""
