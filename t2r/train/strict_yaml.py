"""YAML as a recipe reads it: a mapping that names a key twice is an error naming the key and both lines (plain
YAML keeps the last value silently, so a second `lr:` further down wins unseen)."""

from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one mapping."""


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                first = seen.get(key)
                seen[key] = line
            except TypeError:  # an unhashable key: SafeLoader says so below
                continue
            if first is not None:
                where = f", on line {first} and line {line}" if first != line else ""
                raise DuplicateKeyError(f"key {key!r} is given twice{where}: keep one")
        return super().construct_mapping(node, deep=deep)


def load(text: str):
    """`yaml.safe_load(text)`, refusing a mapping with a repeated key (DuplicateKeyError, a YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
