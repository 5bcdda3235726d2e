"""autoalloc: set PyTorch's CUDA allocator options for matching programs before CUDA starts.

Every process that imports torch imports it (the startup watcher imports ``autoalloc.hook``),
so it imports nothing; the public names are loaded on first access.
"""

__all__ = ["AutoallocWarning", "__version__", "status"]


def __getattr__(name: str):
    if name == "__version__":
        from autoalloc.version import __version__

        return __version__
    if name == "AutoallocWarning":
        from autoalloc.messages import AutoallocWarning

        return AutoallocWarning
    if name == "status":
        from autoalloc.doctor import status

        return status
    raise AttributeError(f"module 'autoalloc' has no attribute {name!r}")
