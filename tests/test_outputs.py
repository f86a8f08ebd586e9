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
