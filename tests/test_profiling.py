import pytest
import torch

from companion.profiling import best_time, saved_tensor_bytes, synchronize


def test_best_time_calls_warmup_then_repeats_times_inner():
    calls = []
    seconds = best_time(lambda: calls.append(1), repeats=3, warmup=2, inner=4)
    assert len(calls) == 2 + 3 * 4
    assert 0 <= seconds < 0.1


def test_best_time_measures_the_minimum_per_call():
    import time

    durations = iter([0.0, 0.03, 0.01, 0.02])  # the first is the warm-up
    seconds = best_time(lambda: time.sleep(next(durations)), repeats=3)
    assert 0.01 <= seconds < 0.02


def test_saved_tensor_bytes_counts_what_backward_needs():
    x = torch.randn(1000, requires_grad=True)
    assert saved_tensor_bytes(lambda: x.exp()) == 1000 * 4  # exp saves its output
    assert saved_tensor_bytes(lambda: x + 1) == 0  # addition saves nothing
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: x.exp()) == 0
    a = torch.randn(64, 32, requires_grad=True)
    b = torch.randn(32, 16, requires_grad=True)
    assert saved_tensor_bytes(lambda: a @ b) == (64 * 32 + 32 * 16) * 4  # matmul saves both inputs


def test_cpu_clock_ignores_time_spent_waiting():
    import time

    assert best_time(lambda: time.sleep(0.02), repeats=2, warmup=0, clock="cpu") < 0.01  # sleeping uses no CPU
    busy = best_time(lambda: sum(range(200_000)), repeats=2, clock="cpu")
    assert busy > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="repeats"):
        best_time(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="inner"):
        best_time(lambda: None, inner=0)
    with pytest.raises(ValueError, match="clock must be 'wall' or 'cpu'"):
        best_time(lambda: None, clock="gpu")
    synchronize("cpu")  # a no-op, but must accept the CPU


@pytest.mark.parametrize("masked", [False, True])
def test_explicit_attention_keeps_one_weight_matrix_for_backward(masked):
    """softmax(QKᵀ)V must save its (L × L) weights once, masked or not (plus q, k, v and the mask)."""
    from companion.attention import causal_mask, scaled_dot_product_attention

    b, h, L, d = 1, 2, 256, 8
    q, k, v = (torch.randn(b, h, L, d, requires_grad=True) for _ in range(3))
    mask = causal_mask(L) if masked else None
    saved = saved_tensor_bytes(lambda: scaled_dot_product_attention(q, k, v, mask)[0])
    one_matrix = b * h * L * L * 4
    assert one_matrix <= saved < 1.5 * one_matrix, saved / one_matrix


def test_cpu_usage_of_counts_work_and_fresh_pages():
    import mmap
    import os

    from companion.profiling import CpuUsage, cpu_usage, cpu_usage_of

    assert isinstance(cpu_usage(), CpuUsage)
    idle = cpu_usage_of(lambda: None)
    busy = cpu_usage_of(lambda: sum(i * i for i in range(3_000_000)))  # pure Python: user time
    assert busy.seconds > 0.05 and busy.seconds > 10 * idle.seconds + 0.01
    assert busy.user >= busy.system

    def touch_fresh_memory():
        # 64 MiB of anonymous memory mapped here and written once: every page is new to the process
        # (a torch.ones of that size may instead reuse a block the allocator kept from an earlier test)
        block = mmap.mmap(-1, 64 * 2**20)
        pages = torch.frombuffer(block, dtype=torch.uint8)
        pages.fill_(1)
        del pages
        block.close()

    usage = cpu_usage_of(touch_fresh_memory)
    if os.name != "nt":  # Windows does not count page faults
        # 16 384 faults with 4 KiB pages; 32 if the kernel backs the block with 2 MiB huge pages
        assert usage.page_faults >= 16, usage
        assert usage.page_faults < 4 * 64 * 2**20 / mmap.PAGESIZE
    with pytest.raises(TypeError, match="fn must be callable"):
        cpu_usage_of(42)
