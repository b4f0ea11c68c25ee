/*
 * The streamed quantisers' per-thread asynchronous copies (swiglu_quantize_stream.cuh,
 * rowcol_stream.cuh): 16 bytes (or a 4-byte scale) global -> the thread's own shared-memory slot by cp.async,
 * commit groups and waits, the slot read back, and the dynamic shared memory that holds the slots. On the device they
 * are the PTX; tests/emu/cuda_emu.h defines them for the CPU emulation (a copy lands at the wait that
 * covers its group, not before).
 */
#ifndef MOK_CUDA_QUANT_STREAM_COPIES_CUH
#define MOK_CUDA_QUANT_STREAM_COPIES_CUH

#include <stdint.h>
#include <cuda_runtime.h>

#ifndef MOK_TESTS_CUDA_EMU_H
#include "../ptx/cp_async.cuh"
#include "../ptx/smem.cuh"

namespace mok_qtile {

__device__ __forceinline__ uint4* stream_fifo() {
    extern __shared__ __align__(16) uint4 mok_stream_fifo[];
    return mok_stream_fifo;
}
/* 16 bytes from src into the slot, or 16 zeros (src unread) when !live */
__device__ __forceinline__ void stream_copy16(uint4* slot, const void* src, bool live) {
    cp_async_16(slot, src, live ? 16u : 0u);
}
/* 4 bytes (a row's scale) from src into the slot, or a zero (src unread) when !live */
__device__ __forceinline__ void stream_copy4(float* slot, const float* src, bool live) {
    cp_async_4(slot, src, live ? 4u : 0u);
}
__device__ __forceinline__ void stream_commit() { cp_async_commit(); }
template <int kPending>
__device__ __forceinline__ void stream_wait() { cp_async_wait<kPending>(); }
__device__ __forceinline__ uint4 stream_read(const uint4* slot) { return ld_shared_u32x4(mok_smem_u32(slot)); }
__device__ __forceinline__ float stream_read_f32(const float* slot) { return ld_shared_f32(slot); }

}  // namespace mok_qtile

#endif /* MOK_TESTS_CUDA_EMU_H */

#endif /* MOK_CUDA_QUANT_STREAM_COPIES_CUH */
