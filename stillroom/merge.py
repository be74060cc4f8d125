"""``stillroom.merge.interpolate`` at the path it was first published under (it lives in
stillroom/runtime/merge.py; the merge stages in stillroom/stages/merge.py)."""

from .runtime.merge import interpolate, merge_adapter

__all__ = ["interpolate", "merge_adapter"]
