"""`t2r.train.readers`: where a stream is read ahead, and the reader server started before torch is imported."""

import subprocess
import sys

import pytest

from t2r.train import readers


@pytest.mark.parametrize("reader, gpu, started", [("auto", True, True), ("auto", False, False), (None, True, True),
                                                   ("process", False, True), ("thread", True, False)])
def test_the_server_starts_early_where_the_stream_will_be_read_in_a_process(monkeypatch, reader, gpu, started):
    calls = []
    monkeypatch.setattr(readers, "gpu_visible", lambda: gpu)
    monkeypatch.setattr(readers, "start_readers", lambda: calls.append(1))
    readers.start_readers_early(reader)
    assert calls == ([1] if started else [])


def test_a_hidden_gpu_is_not_visible(monkeypatch):
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert not readers.gpu_visible()


def test_an_unknown_reader_is_named():
    with pytest.raises(ValueError, match="reader='disk': one of auto, process, thread"):
        readers.resolved_reader("disk", on_gpu=True)


def test_the_module_imports_no_torch():
    """The command line imports it before torch, to start the server beside its own imports (`import t2r` outside
    the command line imports torch itself, to register the Auto classes: the probe poses as the `t2r` script)."""
    code = "import sys; sys.argv = ['t2r']; import t2r.train.readers; print('torch' in sys.modules)"
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert probe.stdout.strip() == "False", probe.stderr
