"""Training data: text sources (hub or local, through `datasets`), tokenising and packing."""

from .config import DataConfig
from .packing import PackedSequences, collate_packed
from .documents import load_documents

__all__ = ["DataConfig", "PackedSequences", "collate_packed", "load_documents"]
