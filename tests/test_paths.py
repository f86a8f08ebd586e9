"""One rule for local paths vs hub ids (`t2r.paths`), used by models, tokenizers, recipes and data; what a hub
id that fails to load says. No network: the hub is never called here."""

import re

import pytest

from t2r import paths


@pytest.mark.parametrize("spec, local", [
    ("gpt2", False), ("owner/name", False), ("Qwen/Qwen2.5-0.5B", False), ("cerebras/SlimPajama-627B", False),
    ("runs/nope/final", True), ("./x", True), ("../x", True), ("/no/such/dir", True), ("~/nope", True),
    ("x.jsonl", True), ("corpus.csv", True), ("shards.arrow", True), ("model.gguf", True),
    ("owner/w.safetensors", True), ("data/*.jsonl", True), ("a b", True), ("a\\b", True), ("-x/y", True),
    ("models/nope", True),  # models/ exists
])
def test_local_or_hub(tmp_path, monkeypatch, spec, local):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    assert paths.looks_local(spec) is local
    if local:
        message = (rf"^not found: {re.escape(spec)} \((no such file or directory|no files match the pattern)"
                   r"( in .*)?; a hub id has the form owner/name\)$")
        with pytest.raises(FileNotFoundError, match=message):
            paths.is_local(spec)
    else:
        assert paths.is_local(spec) is False


def test_existing_paths_are_local_and_every_loader_shares_the_rule(tmp_path, monkeypatch):
    from t2r.data import documents

    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "name").mkdir()
    (tmp_path / "a.jsonl").write_text("{}\n")
    assert paths.is_local("owner/name") and paths.is_local("a.jsonl") and paths.is_local("*.jsonl")
    assert documents.is_local is paths.is_local
    paths.check_model_spec("owner/name")
    for spec in ("smollm2", "none", None, "someone/name"):
        paths.check_model_spec(spec)
    with pytest.raises(FileNotFoundError, match="not found: owner/other-name"):  # owner/ is a local directory
        paths.check_model_spec("owner/other-name")
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(FileNotFoundError, match="not found: dir.gguf"):
        paths.check_model_spec("dir.gguf")


def test_the_model_loader_names_a_missing_path_before_any_hub_call(tmp_path, monkeypatch):
    from t2r.sources import resolve

    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^not found: runs/nope/final \(no such file or directory in "):
        resolve("runs/nope/final")
    assert resolve("owner/name") == ("owner/name", {})
    (tmp_path / "m.gguf").write_bytes(b"")
    assert resolve("m.gguf") == (".", {"gguf_file": "m.gguf"})


def test_a_hub_id_that_fails_says_whether_the_machine_is_offline(monkeypatch):
    from t2r.sources import from_pretrained

    def load(path, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(paths, "_went_offline", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError) as err:
        from_pretrained(load, "owner/name", "owner/name")
    assert str(err.value) == (
        "hub id 'owner/name' did not load: this machine is offline (HF_HUB_OFFLINE=1 is set): only models already "
        "in the hub cache load; unset HF_HUB_OFFLINE to download 'owner/name', or pass a local directory, a .gguf "
        "file or 'smollm2' (built in). (We couldn't connect to 'https://huggingface.co' to load the files.)")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(paths, "_unreachable", lambda: "huggingface.co is unreachable from this machine")
    message = str(paths.hub_error("owner/name", OSError("no connection")))
    assert ("offline (huggingface.co is unreachable from this machine): connect the machine (or set HF_ENDPOINT"
            in message)
    assert "run with HF_HUB_OFFLINE=1 to use models already in the hub cache" in message
    monkeypatch.setattr(paths, "_unreachable", lambda: None)
    assert "the hub answers: check the id" in str(paths.hub_error("owner/name", OSError("404")))


def test_an_unreachable_hub_is_not_retried(monkeypatch, capsys):
    """The command line checks the hub once (3 s at most) and, when it does not answer, loads from the hub
    cache alone instead of retrying for ~50 s."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *paths._PROXY_VARS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "_went_offline", None)
    monkeypatch.setattr(paths, "_unreachable", lambda: "huggingface.co is unreachable from this machine")
    paths.offline_if_unreachable("smollm2", None)  # no hub id: nothing checked
    assert paths._went_offline is None
    paths.offline_if_unreachable("owner/name")
    assert paths._went_offline and paths.os.environ["HF_HUB_OFFLINE"] == "1"
    assert capsys.readouterr().err == ("note: huggingface.co is unreachable from this machine: loading 'owner/name' "
                                       "from the hub cache only\n")
    assert "HF_HUB_OFFLINE=1 to use" not in str(paths.hub_error("owner/name", OSError("x")))  # set already


def test_going_offline_reaches_a_hub_library_imported_before(monkeypatch):
    """huggingface_hub reads HF_HUB_OFFLINE when it is imported; imported before the check (as the command line's
    own imports do), it must be told too, or it retries the hub for a minute before the one clear error."""
    import huggingface_hub.constants as constants

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", *paths._PROXY_VARS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(paths, "_went_offline", None)
    monkeypatch.setattr(paths, "_unreachable", lambda: "huggingface.co is unreachable from this machine")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    paths.offline_if_unreachable("owner/name")
    assert constants.HF_HUB_OFFLINE is True
