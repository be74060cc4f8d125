"""``stillroom.merge.interpolate`` at the path it was first published under (it lives in
stillroom/runtime/merge.py; the adapter merge, ``stream_merge``, in
stillroom/runtime/adapter_merge.py; the merge stages in stillroom/stages/merge.py)."""

from .runtime.adapter_merge import stream_merge
from .runtime.merge import interpolate

__all__ = ["interpolate", "stream_merge"]
