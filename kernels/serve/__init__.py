"""The operator service: every registered op served through the Open Inference Protocol (KServe v2, the
HTTP protocol Triton speaks), one instance per GPU. Start it with
`python -m kernels.serve --config <root>/config.yaml`; docs/service.md describes the endpoints, the
configuration and the lifecycle."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernels.serve.app import Service
    from kernels.serve.config import Config
    from kernels.serve.engine import SelfTest


def build_service(cfg: Config) -> tuple[Service, SelfTest]:
    """The service object for `cfg`, and its self-test on the instance's device (run before it listens).
    Raises ValueError for a self_test_ops entry naming no op."""
    from kernels.registry import all_ops
    from kernels.runtime.arrays import SIMULATED
    from kernels.serve import release
    from kernels.serve.admission import Admission
    from kernels.serve.app import Service
    from kernels.serve.engine import Engine, self_test
    from kernels.serve.metrics import Metrics
    from kernels.serve.models import catalogue

    ops = all_ops()
    unknown = [o for o in cfg.service.self_test_ops if o not in ops]
    if unknown:
        raise ValueError(
            f"service.self_test_ops: unknown op(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ops))}"
        )
    rel = release.detect()
    engine = Engine(cfg=cfg)
    metrics = Metrics(
        device=str(cfg.device_id),
        version=rel.version,
        commit=rel.commit,
        manifest_sha256=rel.manifest_sha256,
        simulated=SIMULATED,
    )

    def memory_sink(used: int, total: int) -> None:
        metrics.mem_used.labels(metrics.device).set(used)
        metrics.mem_total.labels(metrics.device).set(total)

    engine.memory_sink = memory_sink
    svc = Service(
        cfg=cfg,
        release=rel,
        models=catalogue(ops),
        engine=engine,
        metrics=metrics,
        admission=Admission(max_concurrency=cfg.service.max_concurrency, max_queue=cfg.service.max_queue),
    )
    chosen = [ops[o] for o in cfg.service.self_test_ops] if cfg.service.self_test_ops else list(ops.values())
    return svc, self_test(ops=chosen, engine=engine)
