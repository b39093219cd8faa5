"""Where a benchmark ran: machine facts, library versions, other Python environments.

Covers: a description of the machine (GPUs through nvidia-ml-py when it is there,
driver and CUDA driver version, CPU model and count, host memory, hostname, OS), the
versions of the libraries a result depends on (read from package metadata, so nothing
heavy is imported), and probing another Python interpreter (the dask-cuda environment)
for the same facts with a stdlib-only snippet; `end_runner`, which a runner process ends
with (its result, these versions added, to its JSON file). Everything is guarded: a
missing library or NVML is reported as absent, never raised.

Does not cover: GPU discovery for the cluster (cudask.devices; this module reads NVML
for the record only). Threading: each call initialises and shuts NVML down itself; call
from one thread at a time.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Import names whose versions a result records, in report order.
VERSION_MODULES: tuple[str, ...] = (
    "cudask",
    "dask",
    "distributed",
    "dask_cuda",
    "numpy",
    "cupy",
    "rmm",
    "numba",
    "pynvml",
    "zict",
)


def _distributions_for(module: str) -> list[str]:
    try:
        mapping = importlib.metadata.packages_distributions()
    except Exception:  # noqa: BLE001 - broken metadata must not break the record
        return []
    return list(mapping.get(module, []))


def version_of(module: str) -> str | None:
    """Version of the distribution providing import name `module`, or None."""
    loaded = sys.modules.get(module)
    version = getattr(loaded, "__version__", None) if loaded is not None else None
    if isinstance(version, str):
        return version
    for dist in _distributions_for(module) or [module.replace("_", "-"), module]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for module in VERSION_MODULES:
        out[module] = version_of(module)
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host_memory() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus() -> dict[str, Any]:
    """GPUs as NVML sees them: {"available": bool, "driver": ..., "devices": [...]}."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed", "devices": []}
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound etc.
        return {"available": False, "reason": f"NVML: {exc}", "devices": []}
    try:
        info: dict[str, Any] = {"available": True, "devices": []}
        try:
            info["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001
            info["driver"] = None
        try:
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
            info["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except Exception:  # noqa: BLE001
            info["cuda_driver"] = None
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            device: dict[str, Any] = {"index": index}
            for key, call in (
                ("name", lambda h: _text(pynvml.nvmlDeviceGetName(h))),
                ("uuid", lambda h: _text(pynvml.nvmlDeviceGetUUID(h))),
                ("memory_total", lambda h: int(pynvml.nvmlDeviceGetMemoryInfo(h).total)),
                ("pci_bus_id", lambda h: _text(pynvml.nvmlDeviceGetPciInfo(h).busId)),
            ):
                try:
                    device[key] = call(handle)
                except Exception:  # noqa: BLE001
                    device[key] = None
            info["devices"].append(device)
        return info
    except Exception as exc:  # noqa: BLE001
        return {"available": False, "reason": f"NVML: {exc}", "devices": []}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def machine() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "kernel": platform.release(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "host_memory": _host_memory(),
        "gpus": gpus(),
    }


def device_total(gpu_info: Mapping[str, Any], device: str) -> int | None:
    """Total memory of `device` (an NVML index or UUID) from `gpus()` output."""
    for entry in gpu_info.get("devices", []):
        if str(entry.get("index")) == device or entry.get("uuid") == device:
            total = entry.get("memory_total")
            return int(total) if total else None
    return None


#: Run by another interpreter: stdlib only, never imports the libraries it asks about.
PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, os, platform, sys
def ver(mod):
    try:
        dists = md.packages_distributions().get(mod) or [mod.replace("_", "-")]
    except Exception:
        dists = [mod.replace("_", "-")]
    for d in dists:
        try:
            return md.version(d)
        except Exception:
            pass
    return None
mods = ["dask_cuda", "dask", "distributed", "cupy", "numpy", "rmm", "numba", "pynvml", "zict",
        "distributed_ucxx"]
found = {m: iu.find_spec(m) is not None for m in mods}
proxy = None
spec = iu.find_spec("dask_cuda")
if spec is not None and spec.submodule_search_locations:
    proxy = any(os.path.exists(os.path.join(p, "proxy_object.py"))
                for p in spec.submodule_search_locations)
print(json.dumps({"executable": sys.executable, "python": platform.python_version(),
                  "found": found, "versions": {m: ver(m) for m in mods},
                  "dask_cuda_has_proxy_object": proxy}))
"""


def probe_python(python: str, env: Mapping[str, str], timeout: float = 60.0) -> dict[str, Any]:
    """Facts about interpreter `python` under `env`; raises RuntimeError when it cannot say."""
    try:
        proc = subprocess.run(
            [python, "-c", PROBE],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise RuntimeError(f"cannot run {python!r}: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{python!r} did not answer within {timeout:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python!r} failed to run a Python probe: {last}")
    try:
        return dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        raise RuntimeError(f"{python!r} is not a Python interpreter that cudask can use") from None


def version_tuple(version: str | None) -> tuple[int, ...]:
    """Leading numeric parts of a version string ("26.04.00a3" -> (26, 4, 0))."""
    parts: list[int] = []
    for piece in (version or "").split("."):
        digits = ""
        for char in piece:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


#: First dask-cuda release without JIT-unspill.
DASK_CUDA_WITHOUT_JIT = (26, 6)


def dask_cuda_has_jit_unspill(version: str | None, has_proxy_object: bool | None) -> bool:
    """Whether a dask-cuda install still has JIT-unspill (removed in 26.06)."""
    if has_proxy_object is False:
        return False
    numbers = version_tuple(version)
    return bool(numbers) and numbers[:2] < DASK_CUDA_WITHOUT_JIT


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def end_runner(result: dict[str, Any], path: str, code: int, runner: str) -> int:
    """A runner's last step: add the versions, write `result` to `path` as JSON, say the
    error on stderr when `code` is not 0; return `code`."""
    result["versions"] = versions()
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    if code:
        sys.stderr.write(f"{runner}: {result['error']}\n")
    return code


__all__ = [
    "DASK_CUDA_WITHOUT_JIT",
    "PROBE",
    "VERSION_MODULES",
    "dask_cuda_has_jit_unspill",
    "device_total",
    "end_runner",
    "gpus",
    "has_module",
    "machine",
    "probe_python",
    "version_of",
    "version_tuple",
    "versions",
]
