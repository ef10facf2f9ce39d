"""`python -m kernels.serve`: one instance of the operator service, on one GPU.

Exit status: 0 drained after SIGTERM, 1 the exit timeout cut work off, 2 bad configuration, 3 the self-test
failed (never ready), 4 the port could not be bound.
"""

from __future__ import annotations

import argparse
import os
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernels.serve", description=__doc__.splitlines()[0])
    p.add_argument("--config", help="node config.yaml (see docs/service.md); default: every default")
    p.add_argument("--device-id", type=int, help="GPU of this instance (overrides device_id)")
    p.add_argument("--instance", help="systemd instance name <device_id>[-<slot>] (sets --device-id)")
    p.add_argument("--port", type=int, help="base port (overrides service.port; the instance adds device_id)")
    # the role passes both from the fleet spec, so a node's service follows the spec even where config.yaml
    # predates the last spec change (the unit's stop timeout is derived from the same value)
    p.add_argument(
        "--exit-timeout-s", type=float, help="longest SIGTERM drain (overrides service.exit_timeout_s)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # config imports no numba: the device binding below must happen before CUDA initialises
    from kernels.serve.config import ConfigError, load

    device_id = args.device_id
    if args.instance is not None:
        head = args.instance.split("-", 1)[0]
        if not head.isdigit():
            print(
                f"solfleet serve: --instance {args.instance!r}: expected <device_id>[-<slot>]",
                file=sys.stderr,
            )
            return 2
        device_id = int(head)
    try:
        cfg = load(args.config, device_id=device_id, port=args.port, exit_timeout_s=args.exit_timeout_s)
    except ConfigError as e:
        print(f"solfleet serve: config: {e}", file=sys.stderr)
        return 2
    if cfg.service.bind == "visible_devices":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(cfg.device_id)

    from kernels.serve.lifecycle import EXIT_BIND, EXIT_SELF_TEST, bind_socket, serve, setup_logging

    setup_logging(cfg)
    import logging

    log = logging.getLogger("solfleet.serve")
    try:
        sock = bind_socket(cfg.service.host, cfg.listen_port)
    except OSError as e:
        log.error("cannot bind %s:%d: %s", cfg.service.host, cfg.listen_port, e.strerror or e)
        return EXIT_BIND

    from kernels.serve import build_service

    try:
        svc, test = build_service(cfg)
    except (RuntimeError, ValueError) as e:
        log.error("cannot start: %s", e)
        return EXIT_SELF_TEST
    if not test.ok:
        for line in test.failed:
            log.error("self-test failed: %s", line)
        log.error("self-test of %s failed on device %d: not serving", svc.release.version, cfg.device_id)
        return EXIT_SELF_TEST
    log.info("self-test passed: %d cases in %.1f s", len(test.results), test.seconds)
    return serve(svc, sock)


if __name__ == "__main__":
    sys.exit(main())
