"""`import dask_cuda` served by cudask, for libraries that import dask_cuda themselves.

Covers: `install(target)`, which writes a two-line `dask_cuda` package into a folder
on the import path (default: this interpreter's site-packages) and refuses where a real
dask-cuda is installed; `remove(target)`, which deletes only such a package; `status()`;
and `serve`, which that package calls when imported: it refuses to stand in for a real
dask-cuda found on the path, then maps `dask_cuda` and its public modules (SUBMODULES)
onto cudask's, so `dask_cuda.utils` *is* `cudask.utils`. `dask_cuda.__version__` is the
dask-cuda release whose API cudask implements (API_LEVEL). Does not cover: dask-cuda's
internal modules (an import of one fails, naming the alias).

Threading: `serve` runs once per process, under the import lock; install and remove
write files from the calling thread.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

#: The dask-cuda release whose public API the alias serves.
API_LEVEL = "26.10.00"
#: dask_cuda's public modules and the cudask modules that serve them.
SUBMODULES = {
    "dask_cuda.local_cuda_cluster": "cudask.deploy.local",
    "dask_cuda.cuda_worker": "cudask.deploy.node",
    "dask_cuda.utils": "cudask.utils",
    "dask_cuda.initialize": "cudask.initialize",
    "dask_cuda.worker_spec": "cudask.worker_spec",
    "dask_cuda.utils_test": "cudask.testing.dask_cuda_helpers",
}
#: The first line of the package install() writes: remove() deletes only such a package.
MARK = '"""dask_cuda served by cudask: written by `cudask alias install`; `cudask alias remove` '
PACKAGE = MARK + 'deletes it."""\nfrom cudask.dask_cuda_alias import serve\n\nserve(globals())\n'
_TOP = {"LocalCUDACluster": "cudask.deploy.local", "CUDAWorker": "cudask.deploy.node"}


class AliasError(ImportError):
    """The alias would stand in for a real dask-cuda, or cannot be written or removed."""


def real_dask_cuda() -> str | None:
    """Where an installed dask-cuda distribution lives, or None."""
    try:
        dist = importlib.metadata.distribution("dask-cuda")
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(dist.locate_file(""))


def _default_target() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _is_alias(package: Path) -> bool:
    init = package / "__init__.py"
    return init.is_file() and init.read_text().startswith(MARK)


def install(target: Path | None = None) -> Path:
    """Write the alias package into `target`; its path. Refused beside a real dask-cuda."""
    folder = target or _default_target()
    real = real_dask_cuda()
    if real is not None:
        raise AliasError(
            f"dask-cuda is installed ({real}): the alias would shadow it; "
            "uninstall dask-cuda first (pip uninstall dask-cuda), or keep it and "
            "use cudask by its own name"
        )
    package = folder / "dask_cuda"
    if package.exists() and not _is_alias(package):
        raise AliasError(f"{package} holds another dask_cuda package; remove it first")
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(PACKAGE)
    return package


def remove(target: Path | None = None) -> Path | None:
    """Delete the alias package from `target` (only one install() wrote); its path, or
    None where there is none."""
    package = (target or _default_target()) / "dask_cuda"
    if not package.exists():
        return None
    if not _is_alias(package):
        raise AliasError(f"{package} is not cudask's alias (a real dask-cuda?); not removed")
    for child in sorted(package.rglob("*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    package.rmdir()
    return package


def status() -> str:
    """One line: where `import dask_cuda` leads in this interpreter."""
    real = real_dask_cuda()
    spec = importlib.util.find_spec("dask_cuda")
    if spec is None or spec.origin is None:
        return "dask_cuda is not importable: neither dask-cuda nor cudask's alias is installed"
    where = Path(spec.origin).parent
    if _is_alias(where):
        clash = f"; dask-cuda is installed too ({real}): remove one" if real else ""
        return f"import dask_cuda gets cudask (alias at {where}){clash}"
    return f"import dask_cuda gets dask-cuda ({where})"


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds dask_cuda's public submodules; loading one returns cudask's module."""

    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in SUBMODULES:
            return importlib.util.spec_from_loader(fullname, self)
        if fullname.startswith("dask_cuda."):
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: cudask's alias of dask_cuda serves "
                f"{', '.join(sorted(SUBMODULES))}",
                name=fullname,
            )
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(SUBMODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """cudask's module has run already."""


def serve(namespace: dict[str, Any]) -> None:
    """Make the alias package `namespace` stand for dask_cuda (called by its __init__)."""
    real = real_dask_cuda()
    if real is not None:
        raise AliasError(
            f"cudask's alias of dask_cuda ({namespace.get('__file__')}) would "
            f"shadow the installed dask-cuda ({real}); run `cudask alias remove`"
        )
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    import cudask

    def attribute(name: str) -> Any:
        if name in _TOP:
            return getattr(importlib.import_module(_TOP[name]), name)
        raise AttributeError(
            f"cudask's alias of dask_cuda has no {name!r}: it serves "
            f"{', '.join(sorted(_TOP))} and the modules "
            f"{', '.join(sorted(SUBMODULES))}"
        )

    namespace.update(
        __version__=API_LEVEL, __cudask_version__=cudask.__version__, __getattr__=attribute
    )


__all__ = [
    "API_LEVEL",
    "SUBMODULES",
    "AliasError",
    "install",
    "real_dask_cuda",
    "remove",
    "serve",
    "status",
]
