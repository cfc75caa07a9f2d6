from flashwatt.devices import visible_gpu_count, visible_gpu_ids


def test_cuda_visible_devices_is_read_as_cuda_does(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert visible_gpu_ids() == ["2", "0"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,3")  # CUDA stops at the first invalid entry
    assert visible_gpu_ids() == ["1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpu_count() == 0


def test_without_the_variable_and_without_nvidia_smi_there_is_no_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert visible_gpu_ids() == []
