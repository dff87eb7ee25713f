from pathlib import Path
import pytest
TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json.gz")))
def test_probe(name):
    pytest.importorskip("hta")
    from hta_oracle import file_gpu_time_by_kernel_name, hta_gpu_time_by_kernel_name, hta_loaded
    p = TRACES / name
    assert hta_gpu_time_by_kernel_name(p).to_dict() == file_gpu_time_by_kernel_name(p, hta_rounding=True).to_dict()
    assert hta_gpu_time_by_kernel_name(p, no_rounding=True).to_dict() == file_gpu_time_by_kernel_name(p).to_dict()
    assert hta_loaded(p) is hta_loaded(str(p))
