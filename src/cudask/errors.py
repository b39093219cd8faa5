"""User-facing exception types.

Covers: the errors cudask raises for bad input (options, sizes, device ids,
missing optional libraries, no GPU), and the warning about a CUDA context where
it costs the workers memory. Each message names the bad value, what is
accepted, and where it helps an example that works. The CLI turns these into a
one-line message and a non-zero exit, never a traceback.

Does not cover: internal errors, which stay ordinary Python exceptions.

Threading: plain exception types; nothing shared.
"""

from __future__ import annotations


class CudaskError(Exception):
    """Base class of every error that is the user's to fix."""


class OptionError(CudaskError, ValueError):
    """An option, flag or config value that cannot be accepted. `option` names the
    declared option (cudask.options) when one value alone is at fault, so the CLI
    can name its flag; `origin` says where a value from the config was set (an
    environment variable, a config file), so the CLI does not call it a misused flag."""

    option: str | None = None  # also for subclasses whose __init__ does not take them
    origin: str | None = None

    def __init__(
        self, message: str = "", *, option: str | None = None, origin: str | None = None
    ) -> None:
        super().__init__(message)
        self.option = option
        self.origin = origin


class ProtocolMismatchError(OptionError, TypeError):
    """A UCX transport asked for with a protocol that is not UCX; a TypeError too, as
    dask-cuda raises there."""


class DeviceError(CudaskError, ValueError):
    """A device id, UUID or CUDA_VISIBLE_DEVICES entry that names no visible GPU."""


class NoGPUError(CudaskError, RuntimeError):
    """The command needs a GPU and NVML finds none (or no NVML library)."""


class MissingDependencyError(CudaskError, ImportError):
    """An optional library an option needs is not installed."""

    def __init__(self, library: str, needed_for: str, install: str) -> None:
        self.library = library
        self.needed_for = needed_for
        self.install = install
        super().__init__(
            f"{needed_for} needs {library}, which is not installed. Install it with: {install}"
        )


class UnknownModuleError(MissingDependencyError, OptionError):
    """A module an option names (pre_import, preload) that is not found here: a
    missing dependency, or a misspelt name; an OptionError as well. `origin`: where
    the option was set, when in the config."""

    def __init__(self, module: str, option: str, accepted: str, origin: str | None = None) -> None:
        where = f"{origin}: " if origin else ""
        CudaskError.__init__(
            self,
            f"{where}{option}={module!r}: ModuleNotFoundError: No module "
            f"named {module!r} here (not installed, or misspelt?); "
            f"accepted: {accepted}",
        )
        self.library = module
        self.needed_for = f"{option}={module!r}"
        self.install = f"install {module} where the workers run"
        self.option = option
        self.origin = origin


def require(module: str, *, needed_for: str, install: str) -> object:
    """Import `module` or raise MissingDependencyError naming what needs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(module, needed_for, install) from exc


class TLSRefusedError(CudaskError, ConnectionError):
    """A TLS handshake with the scheduler failed on a certificate: this node's is not
    accepted there, or the scheduler's is not trusted here."""


class DeviceMemoryLimitWarning(UserWarning):
    """An RMM pool reserves more device memory up front than `device_memory_limit`:
    the GPU memory the worker holds is then the pool's size, and the limit holds
    only what is allocated inside the pool."""


class CUDAContextWarning(RuntimeWarning):
    """A process of the cluster (the client, scheduler or nannies) holds a CUDA context
    on a GPU its workers use, so the memory that context holds is lost to them. A
    warning, so existing code keeps running; make it an error with
    `warnings.filterwarnings("error", category=cudask.errors.CUDAContextWarning)`."""
