"""`snakemake --configfile FILE`: a YAML syntax error, an empty file or a tab indent named by file,
line and column, as `stillroom config FILE` names them.

Snakemake reads every --configfile before it parses the Snakefile (its ConfigSettings), and its
loader (snakemake.common.configfile._load_configfile) turns any YAML error into "Config file is not
valid JSON or YAML" and an empty file into "Config file must be given as JSON or YAML with keys at
top level", so nothing in the workflow runs early enough to say more. `make venv` therefore writes
a one-line .pth file into the venv's site-packages (`main()` below), which Python runs at start-up:
it only puts a finder on sys.meta_path (no import of Snakemake or of the config code), and when
Snakemake imports that module the finder wraps its loader. A file the
loader reads is returned unchanged; only where it fails (or gets no mapping) is the file read again
with the workflow's own loader (stillroom.config.load_yaml), whose error becomes Snakemake's.

A .pth file rather than a Snakemake plugin: plugins are found by scanning for installed modules
named snakemake_<kind>_plugin_*, which an editable install is not, and each kind adds its name to
the command line's choices (--logger, --executor ...) though it would be none of them.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Any

TARGET = "snakemake.common.configfile"
PTH = "stillroom-snakemake-yaml.pth"
# The .pth line: Python runs a line that starts with "import". A no-op where this module is gone
# (the package uninstalled, or a checkout without it first on the path).
PTH_LINE = (
    "import importlib.util as u; u.find_spec('stillroom') and "
    "u.find_spec('stillroom.snakemake_yaml') and "
    "__import__('stillroom.snakemake_yaml').snakemake_yaml.install()\n"
)


def explained(original: Any) -> Any:
    """Snakemake's ``_load_configfile``, with its failures on a config file said by
    ``stillroom.config.load_yaml`` (file:line:column: the YAML problem)."""
    from snakemake_interface_common.exceptions import WorkflowError

    def _load_configfile(configpath_or_obj: Any, filetype: str = "Config") -> Any:
        checkable = filetype == "Config" and isinstance(configpath_or_obj, str | Path)
        try:
            loaded = original(configpath_or_obj, filetype)
        except WorkflowError as exc:
            problem = _problem(configpath_or_obj) if checkable else None
            if problem is None:
                raise
            # Snakemake prints the frames of an error raised outside its own code: with the
            # traceback of its own error, it prints the message alone, as it did before.
            raise WorkflowError(problem).with_traceback(exc.__traceback__) from None
        if checkable and not isinstance(loaded, dict):
            problem = _problem(configpath_or_obj)
            if problem is not None:
                raise WorkflowError(problem)
        return loaded

    _load_configfile.__wrapped__ = original  # type: ignore[attr-defined]
    return _load_configfile


def _problem(path: str | Path) -> str | None:
    """What the workflow's own loader says about the config file at ``path`` (None: nothing)."""
    from .config import ConfigError, load_yaml

    if not Path(path).is_file():
        return None  # Snakemake's own "not found"
    try:
        load_yaml(path)
    except ConfigError as exc:
        return f"Config file {exc}"
    return None


def _wrap(module: Any) -> None:
    """Wrap the module's loader once; a Snakemake without it (renamed) is left as it is."""
    original = getattr(module, "_load_configfile", None)
    if callable(original) and not hasattr(original, "__wrapped__"):
        module._load_configfile = explained(original)


class _Loader:
    """The module's own loader, with ``_load_configfile`` wrapped once the module has run."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _wrap(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package ... of the real loader
        return getattr(self._loader, name)


class _Finder:
    """On sys.meta_path: finds nothing itself; for Snakemake's config-file module, asks the other
    finders and hands back their spec with its loader wrapped."""

    def __init__(self) -> None:
        self._asking = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != TARGET or self._asking:
            return None
        from importlib.util import find_spec

        self._asking = True
        try:
            spec = find_spec(name)
        finally:
            self._asking = False
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Called by the .pth line at start-up: the finder, once."""
    if TARGET in sys.modules:  # already imported (not at start-up): wrap it now
        _wrap(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def pth_path() -> Path:
    """Where `make venv` writes the .pth: this interpreter's site-packages."""
    return Path(sysconfig.get_paths()["purelib"]) / PTH


def main() -> None:
    """Write the .pth (`make venv` runs this each time: a venv made before it gets it too)."""
    path = pth_path()
    if not path.exists() or path.read_text() != PTH_LINE:
        path.write_text(PTH_LINE)
        print(f"wrote {path}: snakemake --configfile names a bad YAML file's line")
