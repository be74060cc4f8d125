"""``stillroom.merge.interpolate`` at the path tests and users import it from (it lives in
stillroom/runtime/merge.py; the merge stages in stillroom/stages/merge.py)."""

from .runtime.merge import interpolate, merge_adapter

__all__ = ["interpolate", "merge_adapter"]
