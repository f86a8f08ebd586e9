"""Training data: text sources (hub or local, through `datasets`), tokenising and packing."""

from .config import DataConfig
from .documents import load_documents
from .packing import PackedSequences, collate_packed

__all__ = ["DataConfig", "PackedSequences", "collate_packed", "load_documents"]
