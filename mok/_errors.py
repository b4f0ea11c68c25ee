"""Errors that only the GPU can see (an expert id out of range in a CUDA plan, later a peer that
does not answer) are ORed by the kernels into a host-mapped word. Reading it is a plain host read
(no synchronisation), so it sees the launches that have finished; mok checks it at the start of
each eager forward, and `mok.check_errors(synchronize=True)` checks after waiting for the GPU."""
import torch

DEVICE_ERR_EXPERT_ID = 1
DEVICE_ERR_UNALIGNED_PLAN = 2


def _raise_for(bits: int) -> None:
    if bits & DEVICE_ERR_EXPERT_ID:
        raise ValueError(
            "mok: topk_idx held an expert id outside [0, num_experts) in an earlier CUDA call "
            "(those (token, k) pairs were left out of the result); pass skip_invalid=True if such ids "
            "mark tokens to skip"
        )
    if bits & DEVICE_ERR_UNALIGNED_PLAN:
        raise ValueError(
            "mok: a CUDA kernel that needs aligned expert offsets (the FP8 grouped GEMMs: multiples of 128 "
            "within the rows; mok.fp8.qdq_mxfp8's column-wise copy: multiples of 32 within [0, M], or M) got others in an earlier "
            "call (its output was not computed); use the offsets of a CUDA plan (mok.functional.moe_plan)"
        )
    if bits:
        raise RuntimeError(f"mok: the GPU reported error bits {bits:#x}")


def check_errors(synchronize: bool = False) -> None:
    """Raises the error a mok kernel reported since the last check, if any (and clears it).

    With synchronize=True, waits for the current device first, so every launch so far is covered."""
    if synchronize and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    bits = torch.ops.mok.device_errors(True)
    if bits:
        _raise_for(bits)
    # Expert-parallel exchanges keep their own record: (set, waiting rank + 1, silent peer + 1, ...).
    # (Only timeouts are raised here; ExpertParallel.check_errors reports the rest of the record.)
    rec = torch.ops.mok.ep_error_record(False)
    if rec[0]:
        torch.ops.mok.ep_error_record(True)
        raise RuntimeError(f"mok.ExpertParallel: rank {rec[1] - 1} timed out waiting for rank {rec[2] - 1}")
