"""The real service (a subprocess on 127.0.0.1, the CUDA simulator at tiny shapes), driven by tritonclient:
every op in JSON and binary mode against its float64 reference, health and metadata, the bad inputs."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from kernels.harness.verify import rel_error
from kernels.registry import all_ops
from kernels.serve.models import CATALOGUE, NOT_SERVED

from .conftest import Instance

OPS = sorted(set(all_ops()) - set(NOT_SERVED))


def _inputs(spec_name: str, seed: int, binary: bool) -> tuple[list[th.InferInput], dict, dict]:
    spec = all_ops()[spec_name]
    case = spec.sim_cases[0]
    prob = spec.make_problem(case, np.random.default_rng(seed))
    ins = []
    for name, a in prob.inputs.items():
        t = th.InferInput(name, list(a.shape), "FP16" if a.dtype == np.float16 else "FP32")
        t.set_data_from_numpy(a, binary_data=binary)
        ins.append(t)
    return ins, prob.reference, dict(prob.scalars)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("op", OPS)
def test_infer_matches_reference(main_instance: Instance, op: str, binary: bool) -> None:
    client = th.InferenceServerClient(main_instance.url)
    ins, ref, scalars = _inputs(op, seed=hash((op, binary)) % 2**32, binary=binary)
    outs = [th.InferRequestedOutput(n, binary_data=binary) for n in ref]
    res = client.infer(op, ins, outputs=outs, parameters=scalars or None)
    tol = all_ops()[op].tolerance[all_ops()[op].sim_cases[0].dtype]
    for name, expected in ref.items():
        err, why = rel_error(res.as_numpy(name), expected)
        assert why is None, f"{op} {name}: {why}"
        assert err <= tol, f"{op} {name}: relative error {err:.3g} > {tol:.3g}"
    body = res.get_response()
    assert body["parameters"]["solfleet_version"] == "dev"  # served from a checkout, not a release
    assert body["model_version"] == "dev"


def test_health_and_metadata(main_instance: Instance) -> None:
    client = th.InferenceServerClient(main_instance.url)
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["version"] == "dev" and "binary_tensor_data" in meta["extensions"]
    for op in OPS:
        assert client.is_model_ready(op)
        m = client.get_model_metadata(op)
        assert [t["name"] for t in m["inputs"]] == [t.name for t in CATALOGUE[op]["inputs"]]
        assert m["inputs"][0]["datatype"] in ("FP32", "FP16")
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_metadata("nope")
    assert not client.is_model_ready("nope")


def _raw(
    inst: Instance, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", inst.port, timeout=30)
    conn.request("POST", path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def _ra_json(x: list[float], shape: list[int], dt: str = "FP32", rname: str = "r") -> bytes:
    return json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": dt, "shape": shape, "data": x},
                {"name": rname, "datatype": dt, "shape": shape, "data": x},
            ]
        }
    ).encode()


BAD = {
    "unknown op": ("/v2/models/matmul9/infer", _ra_json([1.0], [1, 1]), "unknown model 'matmul9'"),
    "wrong name": (
        "/v2/models/residual_add/infer",
        _ra_json([1.0], [1, 1], rname="y"),
        "input 'y': residual_add has no input",
    ),
    "wrong dtype": (
        "/v2/models/residual_add/infer",
        _ra_json([1.0], [1, 1], dt="FP64"),
        "input 'x': datatype FP64, expected FP32 or FP16",
    ),
    "wrong rank": (
        "/v2/models/residual_add/infer",
        _ra_json([1.0], [1]),
        "input 'x': shape [1] has 1 dimensions, expected 2",
    ),
    "data/shape mismatch": (
        "/v2/models/residual_add/infer",
        _ra_json([1.0, 2.0], [1, 3]),
        "input 'x': 'data' has 2 elements, expected 3",
    ),
    "huge declared shape": (
        "/v2/models/residual_add/infer",
        _ra_json([1.0], [1 << 20, 1 << 20]),
        "needs 12582912.0 MiB of device memory",
    ),
    "over memory_limit_mb": (
        "/v2/models/residual_add/infer",
        _ra_json([1.0], [1024, 1024]),
        "memory_limit_mb is 8",
    ),
    "not JSON": ("/v2/models/residual_add/infer", b"{inputs", "request header is not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_400_and_service_keeps_serving(main_instance: Instance, case: str) -> None:
    path, body, expected = BAD[case]
    before = main_instance.metric(
        "solfleet_serve_requests_total", device="0", op="residual_add", outcome="success"
    )
    status, _, data = _raw(main_instance, path, body)
    assert status == 400, data
    assert expected in json.loads(data)["error"]
    status, _, data = _raw(main_instance, "/v2/models/residual_add/infer", _ra_json([1.0, 2.0], [1, 2]))
    assert status == 200 and json.loads(data)["outputs"][0]["data"] == [2.0, 4.0]
    assert (
        main_instance.metric(
            "solfleet_serve_requests_total", device="0", op="residual_add", outcome="success"
        )
        == before + 1
    )


def test_truncated_binary_body(main_instance: Instance) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    head = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
                {"name": "r", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
            ]
        }
    ).encode()
    hdr = {"Inference-Header-Content-Length": str(len(head))}
    status, _, data = _raw(
        main_instance, "/v2/models/residual_add/infer", head + x.tobytes() + x.tobytes()[:10], hdr
    )
    assert status == 400
    assert json.loads(data)["error"] == (
        "input 'r': truncated binary body: binary_data_size is 24 but only 10 bytes remain"
    )
    # a size that disagrees with the declared shape is named too
    head2 = head.replace(b'"binary_data_size": 24}}]', b'"binary_data_size": 20}}]')
    status, _, data = _raw(
        main_instance,
        "/v2/models/residual_add/infer",
        head2 + x.tobytes() + x.tobytes()[:20],
        {"Inference-Header-Content-Length": str(len(head2))},
    )
    assert (
        status == 400 and "input 'r': binary_data_size is 20 bytes, expected 24" in json.loads(data)["error"]
    )


def test_nan_refused_where_it_matters(main_instance: Instance) -> None:
    """softmax: one NaN would poison its row, so it is refused; residual_add is element by element, so a
    NaN there is the caller's value and comes back in its place."""
    client = th.InferenceServerClient(main_instance.url)
    x = np.ones((2, 5), dtype=np.float32)
    x[1, 3] = np.nan
    t = th.InferInput("x", [2, 5], "FP32")
    t.set_data_from_numpy(x, binary_data=True)
    with pytest.raises(InferenceServerException) as e:
        client.infer("softmax", [t])
    assert e.value.status() == "400"
    assert "input 'x': 1 of 10 elements are NaN or infinite" in e.value.message()
    r = th.InferInput("r", [2, 5], "FP32")
    r.set_data_from_numpy(np.ones_like(x), binary_data=True)
    out = client.infer("residual_add", [t, r]).as_numpy("out")
    assert np.isnan(out[1, 3]) and np.count_nonzero(np.isnan(out)) == 1
    # a required scalar parameter that is missing, or not positive
    g = th.InferInput("g0", [4], "FP32")
    g.set_data_from_numpy(np.ones(4, dtype=np.float32), binary_data=True)
    with pytest.raises(InferenceServerException, match="parameter 'max_norm': missing"):
        client.infer("clip_grad_norm", [g])
    with pytest.raises(InferenceServerException, match="parameter 'max_norm': -1.0, expected a positive"):
        client.infer("clip_grad_norm", [g], parameters={"max_norm": -1.0})


def test_metrics_count_outcomes(main_instance: Instance) -> None:
    text = main_instance.metrics()
    assert 'solfleet_serve_release_info{commit="",device="0",manifest_sha256="",simulated=' in text
    assert (
        main_instance.metric(
            "solfleet_serve_requests_total", device="0", op="(unknown)", outcome="bad_request"
        )
        >= 1
    )
    assert main_instance.metric("solfleet_serve_compute_seconds_count", device="0", op="residual_add") >= 2
    assert main_instance.metric("solfleet_serve_ready", device="0") == 1
    assert main_instance.metric("solfleet_serve_in_flight", device="0") == 0
