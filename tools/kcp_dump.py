"""Compatibility shim: `import kcp_dump` with PYTHONPATH=tools loads the package in tools/kcp_dump/kcp_dump
(install it with `pip install ./tools/kcp_dump` instead). See tools/kcp_dump/kcp_dump/__init__.py."""
import importlib.util
import os
import sys

_pkg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kcp_dump", "kcp_dump")
_spec = importlib.util.spec_from_file_location("kcp_dump", os.path.join(_pkg, "__init__.py"),
                                               submodule_search_locations=[_pkg])
_mod = importlib.util.module_from_spec(_spec)
sys.modules["kcp_dump"] = _mod
_spec.loader.exec_module(_mod)
