"""The KServe v2 infer body, JSON and the binary tensor data extension (Triton's `binary_tensor_data`).

A binary request is a JSON header of `Inference-Header-Content-Length` bytes followed by the raw bytes of
every input whose `parameters.binary_data_size` is set, in the order the header lists them (row-major,
little-endian). A binary response has the same layout: outputs asked for with `parameters.binary_data`
(or all of them with the request parameter `binary_data_output`) carry `binary_data_size` and their bytes
follow the JSON header. No JSON schema library: every field is read once here, and a bad one is one line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernels.serve.models import NP_OF, BadInput, Plan

JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"
HEADER_LENGTH = "inference-header-content-length"


@dataclass
class Request:
    """A parsed infer header, with each input's bytes located but not yet decoded."""

    id: str
    params: dict[str, Any]
    declared: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, v2 datatype)
    json_data: dict[str, Any] = field(default_factory=dict)  # name -> the "data" list
    binary: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (offset, size) in body
    outputs: dict[str, bool] | None = None  # requested outputs -> binary?; None: all
    binary_output: bool = False


def _shape(name: str, raw: Any) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise BadInput(f"input {name!r}: shape {raw!r} is not a list of integers")
    return tuple(raw)


def parse(body: bytes, header_length: str | None) -> Request:
    """Split and read the header. Input bytes are only located: the plan (shapes, memory limit) is checked
    before anything is decoded."""
    if header_length is None:
        hlen = len(body)
    else:
        try:
            hlen = int(header_length)
        except ValueError:
            raise BadInput(f"Inference-Header-Content-Length: {header_length!r} is not an integer") from None
        if not 0 < hlen <= len(body):
            raise BadInput(f"Inference-Header-Content-Length: {hlen}, but the body has {len(body)} bytes")
    try:
        head = json.loads(body[:hlen])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"request header is not valid JSON: {e}") from None
    if not isinstance(head, dict):
        raise BadInput("request header: expected a JSON object with 'inputs'")
    params = head.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadInput("parameters: expected a JSON object")
    raw_inputs = head.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadInput("inputs: expected a non-empty list of tensors")
    req = Request(id=str(head.get("id", "")), params=params, declared={})
    offset = hlen
    for t in raw_inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise BadInput("inputs: every tensor needs a string 'name'")
        name = t["name"]
        if name in req.declared:
            raise BadInput(f"input {name!r}: given twice")
        dt = t.get("datatype")
        if not isinstance(dt, str):
            raise BadInput(f"input {name!r}: missing 'datatype'")
        shape = _shape(name, t.get("shape"))
        req.declared[name] = (shape, dt)
        tp = t.get("parameters") or {}
        size = tp.get("binary_data_size") if isinstance(tp, dict) else None
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise BadInput(f"input {name!r}: binary_data_size {size!r} is not a non-negative integer")
            if offset + size > len(body):
                raise BadInput(
                    f"input {name!r}: truncated binary body: binary_data_size is {size} but only "
                    f"{len(body) - offset} bytes remain"
                )
            req.binary[name] = (offset, size)
            offset += size
        elif "data" in t:
            req.json_data[name] = t["data"]
        else:
            raise BadInput(f"input {name!r}: neither 'data' nor parameters.binary_data_size")
    if offset != len(body):
        raise BadInput(f"binary body: {len(body) - offset} bytes after the last binary input")
    outs = head.get("outputs")
    if outs is not None:
        if not isinstance(outs, list):
            raise BadInput("outputs: expected a list of {name, parameters}")
        req.outputs = {}
        for o in outs:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise BadInput("outputs: every requested output needs a string 'name'")
            op = o.get("parameters") or {}
            req.outputs[o["name"]] = bool(op.get("binary_data", False)) if isinstance(op, dict) else False
    req.binary_output = bool(params.get("binary_data_output", False))
    return req


def decode(req: Request, body: bytes | memoryview, plan: Plan) -> dict[str, np.ndarray]:
    """Host arrays of the inputs (binary ones are views of the body, no copy)."""
    out: dict[str, np.ndarray] = {}
    for name, (shape, dt) in plan.inputs.items():
        count = math.prod(shape)
        if name in req.binary:
            off, size = req.binary[name]
            if size != count * dt.itemsize:
                raise BadInput(
                    f"input {name!r}: binary_data_size is {size} bytes, expected {count * dt.itemsize} "
                    f"for shape {list(shape)} of {req.declared[name][1]}"
                )
            out[name] = np.frombuffer(body, dtype=dt.newbyteorder("<"), count=count, offset=off).reshape(
                shape
            )
        else:
            data = req.json_data[name]
            try:
                arr = np.asarray(data, dtype=np.float64 if dt.kind == "f" else dt)
            except (TypeError, ValueError):
                raise BadInput(f"input {name!r}: 'data' is not a list of numbers") from None
            if arr.size != count:
                raise BadInput(
                    f"input {name!r}: 'data' has {arr.size} elements, expected {count} for shape "
                    f"{list(shape)}"
                )
            out[name] = np.ascontiguousarray(arr.reshape(shape), dtype=dt)
    return out


def _v2(dt: np.dtype) -> str:
    return next(k for k, v in NP_OF.items() if v == dt)


def encode(
    *,
    model: str,
    version: str,
    req: Request,
    results: dict[str, np.ndarray],
    params: dict[str, Any],
) -> tuple[bytes, int | None]:
    """The response body and, when any output is binary, the JSON header's length."""
    if req.outputs is not None:
        unknown = [n for n in req.outputs if n not in results]
        if unknown:
            raise BadInput(
                f"output {unknown[0]!r}: {model} has no output of that name; outputs: {', '.join(results)}"
            )
        wanted = req.outputs
    else:
        wanted = {n: req.binary_output for n in results}
    outs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, binary in wanted.items():
        a = results[name]
        t: dict[str, Any] = {"name": name, "datatype": _v2(a.dtype), "shape": list(a.shape)}
        if binary:
            raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
            t["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            t["data"] = a.reshape(-1).tolist()
        outs.append(t)
    head: dict[str, Any] = {
        "model_name": model,
        "model_version": version,
        "outputs": outs,
        "parameters": params,
    }
    if req.id:
        head["id"] = req.id
    hb = json.dumps(head, allow_nan=True).encode()
    if not chunks:
        return hb, None
    return b"".join([hb, *chunks]), len(hb)


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
