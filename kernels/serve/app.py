"""The HTTP surface: the KServe v2 / Triton HTTP endpoints on Starlette (the ASGI toolkit FastAPI is built
on; docs/service.md says why not FastAPI itself).

Routes take the raw request: the infer body is parsed by kernels.serve.codec (the binary extension is no
JSON body a schema could describe), and each response is built by hand, so a request pays for no model
validation layer. Every response body of /infer, and the `/v2` metadata, name the release serving it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kernels.serve import codec
from kernels.serve.admission import Admission, Refusal, Refused
from kernels.serve.config import Config
from kernels.serve.engine import DeviceFailed, Engine, Transient
from kernels.serve.metrics import Metrics, Outcome
from kernels.serve.models import BadInput, Model, plan
from kernels.serve.release import Release

log = logging.getLogger("solfleet.serve")
EXTENSIONS = ["binary_tensor_data", "model_metadata"]
HEADER_SLACK = 16 * 1024 * 1024  # JSON header bytes allowed on top of memory_limit_mb in one body


class State(enum.Enum):
    STARTING = "starting"  # self-testing, not yet listening
    READY = "ready"
    DRAINING = "draining"  # SIGTERM: serving what it has, accepting no new connections
    FAILED = "failed"  # a device error: not ready until restarted


@dataclass
class Service:
    cfg: Config
    release: Release
    models: dict[str, Model]
    engine: Engine
    metrics: Metrics
    admission: Admission
    state: State = State.STARTING
    reason: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.params = {
            "solfleet_version": self.release.version,
            "solfleet_pid": os.getpid(),
            "solfleet_device": self.cfg.device_id,
        }

    @property
    def ready(self) -> bool:
        return self.state is State.READY and self.engine.failed is None

    def set_state(self, state: State, reason: str = "") -> None:
        self.state = state
        self.reason = reason
        self.metrics.ready.labels(self.metrics.device).set(1 if self.ready else 0)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(
        codec.error_body(message), status_code=status, media_type=codec.JSON_TYPE, headers=headers
    )


def build(svc: Service) -> Starlette:
    m = svc.metrics
    dev = m.device

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        if svc.ready:
            return Response(status_code=200)
        why = svc.engine.failed or svc.reason or svc.state.value
        return _error(503, f"not ready: {why}")

    async def server_metadata(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "name": "solfleet",
                "version": svc.release.version,
                "extensions": EXTENSIONS,
                "parameters": svc.params | {"state": svc.state.value, "commit": svc.release.commit},
            }
        )

    def _model(name: str) -> Model | Response:
        model = svc.models.get(name)
        if model is None:
            return _error(404, f"unknown model {name!r}; models: {', '.join(svc.models)}")
        return model

    async def model_metadata(request: Request) -> Response:
        name = request.path_params["name"]
        model = _model(name)
        if isinstance(model, Response):
            return model
        return JSONResponse(model.metadata(svc.release.version))

    async def model_ready(request: Request) -> Response:
        name = request.path_params["name"]
        model = _model(name)
        if isinstance(model, Response):
            return model
        return Response(status_code=200) if svc.ready else _error(503, f"{name}: instance not ready")

    async def metrics(request: Request) -> Response:
        return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def infer(request: Request) -> Response:
        name = request.path_params["name"]
        model = svc.models.get(name)
        if model is None:
            # a fixed label: client-chosen names would grow the series without bound
            m.count("(unknown)", Outcome.BAD_REQUEST)
            return _error(400, f"unknown model {name!r}; models: {', '.join(svc.models)}")
        if not svc.ready and svc.state is not State.DRAINING:
            m.count(name, Outcome.ERROR if svc.engine.failed else Outcome.REJECTED)
            return _error(503, f"not ready: {svc.engine.failed or svc.state.value}", {"Retry-After": "1"})
        limit = svc.cfg.memory_limit_bytes + HEADER_SLACK
        clen = request.headers.get("content-length")
        if clen is not None and clen.isdigit() and int(clen) > limit:
            m.count(name, Outcome.BAD_REQUEST)
            return _error(
                400,
                f"request body of {int(clen)} bytes is over the limit of {limit} "
                f"(memory_limit_mb + {HEADER_SLACK >> 20} MiB of header)",
            )
        body = await request.body()
        try:
            req = codec.parse(body, request.headers.get(codec.HEADER_LENGTH))
            p = plan(model, req.declared, req.params, memory_limit=svc.cfg.memory_limit_bytes)
            host = codec.decode(req, body, p)
        except BadInput as e:
            m.count(name, Outcome.BAD_REQUEST)
            log.info("400 %s: %s", name, e)
            return _error(400, str(e))
        timeout_s = svc.cfg.timeout_ms / 1000.0
        t_req = req.params.get("timeout")  # Triton's per-request timeout, in microseconds
        if isinstance(t_req, int) and not isinstance(t_req, bool) and t_req > 0:
            timeout_s = min(timeout_s, t_req / 1e6)
        try:
            m.queued.labels(dev).set(svc.admission.queued + 1)
            queued_s = await svc.admission.acquire(timeout_s=timeout_s)
        except Refused as e:
            if e.kind is Refusal.REJECTED:
                m.count(name, Outcome.REJECTED)
                return _error(503, f"{name}: rejected: {e}", {"Retry-After": "1"})
            m.count(name, Outcome.TIMEOUT)
            return _error(504, f"{name}: timeout: {e}")
        finally:
            m.queued.labels(dev).set(svc.admission.queued)
        m.queue_seconds.labels(dev, name).observe(queued_s)
        m.in_flight.labels(dev).set(svc.admission.running)
        loop = asyncio.get_running_loop()
        try:
            res = await loop.run_in_executor(svc.engine.pool, svc.engine.run, model, p, host)
        except BadInput as e:
            m.count(name, Outcome.BAD_REQUEST)
            return _error(400, str(e))
        except Transient as e:
            m.count(name, Outcome.ERROR)
            return _error(503, str(e), {"Retry-After": "1"})
        except DeviceFailed as e:
            m.count(name, Outcome.ERROR)
            svc.set_state(State.FAILED, str(e))
            return _error(500, f"{name}: {e}; the instance is no longer ready")
        finally:
            svc.admission.release()
            m.in_flight.labels(dev).set(svc.admission.running)
        m.compute_seconds.labels(dev, name).observe(res.compute_s)
        if res.retries:
            m.retries.labels(dev, name).inc(res.retries)
        try:
            out, hlen = codec.encode(
                model=name, version=svc.release.version, req=req, results=res.outputs, params=svc.params
            )
        except BadInput as e:
            m.count(name, Outcome.BAD_REQUEST)
            return _error(400, str(e))
        m.count(name, Outcome.SUCCESS)
        if hlen is None:
            return Response(out, media_type=codec.JSON_TYPE)
        return Response(
            out, media_type=codec.BINARY_TYPE, headers={"Inference-Header-Content-Length": str(hlen)}
        )

    def closing(fn: Any) -> Any:
        # while draining, every response ends its connection: a keep-alive client reconnects, and the new
        # instance (listening on the same port) takes it
        async def handler(request: Request) -> Response:
            response: Response = await fn(request)
            if svc.state is State.DRAINING:
                response.headers["connection"] = "close"
            return response

        return handler

    routes = [
        Route("/v2/health/live", closing(live)),
        Route("/v2/health/ready", closing(ready)),
        Route("/v2", closing(server_metadata)),
        Route("/v2/models/{name}", closing(model_metadata)),
        Route("/v2/models/{name}/ready", closing(model_ready)),
        Route("/v2/models/{name}/infer", closing(infer), methods=["POST"]),
        Route("/metrics", closing(metrics)),
    ]
    app = Starlette(routes=routes)
    app.state.svc = svc
    return app
