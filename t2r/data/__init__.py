"""Training data: text sources (hub or local, through `datasets`), tokenising and packing.

The names load on first use (`t2r.lazy`): importing the package imports no torch."""

from t2r.lazy import lazy_exports

_EXPORTS = {
    "DataConfig": ".config", "load_documents": ".documents", "PackedSequences": ".packing",
    "collate_packed": ".packing",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
