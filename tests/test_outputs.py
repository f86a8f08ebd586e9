"""`replace_dir`: a directory replaced is never missing, not even for a moment (a crash then left --out empty)."""

import threading

from t2r.outputs import replace_dir


def test_a_replaced_directory_is_never_missing(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "config.json").write_text("0")
    missing, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            if not (target / "config.json").exists():
                missing.append(1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(1, 200):
            new = tmp_path / ".tmp-out"
            new.mkdir()
            (new / "config.json").write_text(str(i))
            replace_dir(new, target)
    finally:
        stop.set()
        watcher.join()
    assert (target / "config.json").read_text() == "199" and not missing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    replace_dir(target, tmp_path / "absent")  # nothing to replace: a rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["absent"]


def test_a_symbolic_link_keeps_pointing_at_the_replaced_directory(tmp_path):
    """Before: `Cannot call rmtree on a symbolic link` (no path), after the link had already been swapped away."""
    from t2r.model_dir import staging_dir, write_model_dir

    real = tmp_path / "disk" / "model"
    real.mkdir(parents=True)
    (real / "config.json").write_text("old")
    link = tmp_path / "out"
    link.symlink_to(real, target_is_directory=True)
    assert staging_dir(link) == tmp_path / "disk" / ".tmp-model"  # beside the real directory: one filesystem
    write_model_dir(link, lambda tmp: (tmp / "config.json").write_text("new"))
    assert link.is_symlink() and (real / "config.json").read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "disk").iterdir()) == ["model"]
