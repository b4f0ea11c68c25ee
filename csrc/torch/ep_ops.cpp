// torch.ops.mok expert-parallel exchange: schemas, argument checks and the CUDA implementation
// (tensors -> mok_ep_*_args, current stream, launch; no host synchronisation). Fake kernels and
// autograd live in mok/_ep_ops.py; the Python group objects in mok/ep.py.
#include <torch/library.h>

#include <mutex>
#include <vector>

#include "checks.h"

#ifdef MOK_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda/mok_ep_cuda.h"
#endif

namespace mok {
namespace {

constexpr int kErrWords = 8;  // MOK_EP_ERR_WORDS

// The process-wide error record of the exchange kernels: pinned, mapped host memory that kernels
// write through its UVA address and the host reads without synchronising.
int32_t* ep_error_words() {
#ifdef MOK_WITH_CUDA
    static int32_t* words = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void* p = nullptr;
        if (cudaHostAlloc(&p, kErrWords * sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable) ==
            cudaSuccess) {
            words = static_cast<int32_t*>(p);
            for (int i = 0; i < kErrWords; ++i) words[i] = 0;
        } else {
            (void)cudaGetLastError();
        }
    });
    return words;
#else
    return nullptr;
#endif
}

int64_t ep_error_ptr() {
    int32_t* w = ep_error_words();
    TORCH_CHECK(w != nullptr, "mok.ep_error_ptr: no host-mapped error record (mok built without CUDA, or "
                              "cudaHostAlloc failed)");
    return reinterpret_cast<int64_t>(w);
}

std::vector<int64_t> ep_error_record(bool clear) {
    std::vector<int64_t> out(kErrWords, 0);
    volatile int32_t* w = ep_error_words();
    if (!w) return out;
    for (int i = 0; i < kErrWords; ++i) out[i] = w[i];
    if (clear)
        for (int i = 0; i < kErrWords; ++i) w[i] = 0;
    return out;
}

struct CommInts {
    int64_t rank_base, world, capacity, buf_bytes, blocks, timeout_us, silent_rank;
};

// Checks shared by both exchange ops; returns the number of ranks R of the stacked tensors.
int64_t check_comm(const char* op, const at::Tensor& data, const at::Tensor& dst, const at::Tensor& pos,
                   const at::Tensor& table, const CommInts& c) {
    TORCH_CHECK_VALUE(c.world >= 1 && c.world <= 64, op, ": world must be in [1, 64], got ", c.world);
    TORCH_CHECK_VALUE(c.capacity >= 1, op, ": capacity must be >= 1, got ", c.capacity);
    TORCH_CHECK_VALUE(c.blocks >= 1 && c.blocks <= 1024, op, ": blocks must be in [1, 1024], got ", c.blocks);
    TORCH_CHECK_VALUE(c.timeout_us >= 1, op, ": timeout_us must be >= 1, got ", c.timeout_us);
    check_dim(dst, 2, op, "dst", "[R, pairs]");
    check_index(dst, data, op, "dst");
    check_index(pos, data, op, "pos");
    TORCH_CHECK_VALUE(pos.sizes() == dst.sizes(), op, ": pos must have the shape of dst ", shape_str(dst),
                      ", got ", shape_str(pos));
    const int64_t R = dst.size(0);
    TORCH_CHECK_VALUE(R == 1 || R == c.world, op, ": the stacked ranks R = dst.shape[0] must be 1 (one rank per "
                      "process) or world=", c.world, " (virtual ranks), got ", R);
    TORCH_CHECK_VALUE(c.rank_base >= 0 && c.rank_base + R <= c.world, op, ": rank_base=", c.rank_base,
                      " with ", R, " ranks is outside the world of ", c.world);
    check_dim(table, 1, op, "table", "[2 * world + 1]");
    check_dtype(table, at::kLong, op, "table");
    check_contiguous(table, op, "table");
    check_same_device(table, data, op, "table", "the data");
    check_size(table, 0, 2 * c.world + 1, op, "table", "2 * world + 1 pointers");
    check_dim(data, 3, op, "the row tensor", "[R, rows, H]");
    check_contiguous(data, op, "the row tensor");
    check_size(data, 0, R, op, "the row tensor", "stacked ranks");
    to_mok_dtype(data, op, "the row tensor");
    const int64_t row_bytes = data.size(2) * (int64_t)data.element_size();
    const int64_t need = (c.world * c.capacity * 4 + 255) / 256 * 256 + c.world * c.capacity * row_bytes;
    TORCH_CHECK_VALUE(c.buf_bytes >= need, op, ": the exchange buffers hold ", c.buf_bytes, " bytes, rows of ",
                      row_bytes, " bytes need ", need, " (hidden size or dtype larger than the group was made for?)");
    return R;
}

#ifdef MOK_WITH_CUDA
mok_ep_comm make_comm(const at::Tensor& table, const at::Tensor& data, int64_t R, const CommInts& c) {
    mok_ep_comm m{};
    m.table = table.data_ptr<int64_t>();
    m.world = (int)c.world;
    m.ranks = (int)R;
    m.rank_base = (int)c.rank_base;
    m.blocks = (int)c.blocks;
    m.capacity = c.capacity;
    m.row_bytes = data.size(2) * (int64_t)data.element_size();
    m.buf_bytes = c.buf_bytes;
    m.timeout_ns = (uint64_t)c.timeout_us * 1000u;
    m.silent_rank = (int)c.silent_rank;
    return m;
}

cudaStream_t stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
#endif

std::tuple<at::Tensor, at::Tensor, at::Tensor> ep_dispatch(const at::Tensor& src, int64_t src_div,
                                                           const at::Tensor& dst, const at::Tensor& pos,
                                                           const at::Tensor& eid, const at::Tensor& counts,
                                                           const at::Tensor& table, int64_t rank_base, int64_t world,
                                                           int64_t capacity, int64_t buf_bytes, int64_t blocks,
                                                           int64_t timeout_us, int64_t silent_rank) {
    const char* op = "mok.ep_dispatch";
    CommInts c{rank_base, world, capacity, buf_bytes, blocks, timeout_us, silent_rank};
    const int64_t R = check_comm(op, src, dst, pos, table, c);
    TORCH_CHECK_VALUE(src_div >= 1, op, ": src_div must be >= 1, got ", src_div);
    TORCH_CHECK_VALUE(dst.size(1) <= src.size(1) * src_div, op, ": ", dst.size(1), " pairs need ",
                      "src.shape[1] * src_div >= pairs, got src of shape ", shape_str(src), " and src_div ", src_div);
    check_index(eid, src, op, "eid");
    TORCH_CHECK_VALUE(eid.sizes() == dst.sizes(), op, ": eid must have the shape of dst ", shape_str(dst));
    check_index(counts, src, op, "counts");
    check_dim(counts, 2, op, "counts", "[R, world]");
    check_size(counts, 0, R, op, "counts", "stacked ranks");
    check_size(counts, 1, world, op, "counts", "world");
    const int64_t slots = world * capacity;
    auto recv = at::empty({R, slots, src.size(2)}, src.options());
    auto recv_eid = at::empty({R, slots}, dst.options());
    auto recv_counts = at::empty({R, world}, dst.options());
#ifdef MOK_WITH_CUDA
    TORCH_CHECK(src.is_cuda(), op, " runs on CUDA only (on the CPU use the torch backend of mok.ep)");
    c10::cuda::CUDAGuard guard(src.device());
    mok_ep_dispatch_args a{};
    a.comm = make_comm(table, src, R, c);
    a.src = src.data_ptr();
    a.src_rows = src.size(1);
    a.pairs = dst.size(1);
    a.src_div = src_div;
    a.dst = dst.data_ptr<int32_t>();
    a.pos = pos.data_ptr<int32_t>();
    a.eid = eid.data_ptr<int32_t>();
    a.counts = counts.data_ptr<int32_t>();
    a.recv = recv.data_ptr();
    a.recv_eid = recv_eid.data_ptr<int32_t>();
    a.recv_counts = recv_counts.data_ptr<int32_t>();
    check_status(mok_ep_dispatch_cuda(&a, stream_of(src)), op);
#else
    TORCH_CHECK(false, op, " runs on CUDA only (on the CPU use the torch backend of mok.ep)");
#endif
    return {recv, recv_eid, recv_counts};
}

at::Tensor ep_combine(const at::Tensor& rows, const at::Tensor& recv_counts, const at::Tensor& dst,
                      const at::Tensor& pos, const at::Tensor& table, int64_t rank_base, int64_t world,
                      int64_t capacity, int64_t buf_bytes, int64_t blocks, int64_t timeout_us, int64_t silent_rank) {
    const char* op = "mok.ep_combine";
    CommInts c{rank_base, world, capacity, buf_bytes, blocks, timeout_us, silent_rank};
    const int64_t R = check_comm(op, rows, dst, pos, table, c);
    check_size(rows, 1, world * capacity, op, "rows", "world * capacity slots");
    check_index(recv_counts, rows, op, "recv_counts");
    check_dim(recv_counts, 2, op, "recv_counts", "[R, world]");
    check_size(recv_counts, 0, R, op, "recv_counts", "stacked ranks");
    check_size(recv_counts, 1, world, op, "recv_counts", "world");
    auto out = at::empty({R, dst.size(1), rows.size(2)}, rows.options());
#ifdef MOK_WITH_CUDA
    TORCH_CHECK(rows.is_cuda(), op, " runs on CUDA only (on the CPU use the torch backend of mok.ep)");
    c10::cuda::CUDAGuard guard(rows.device());
    mok_ep_combine_args a{};
    a.comm = make_comm(table, rows, R, c);
    a.rows = rows.data_ptr();
    a.recv_counts = recv_counts.data_ptr<int32_t>();
    a.pairs = dst.size(1);
    a.dst = dst.data_ptr<int32_t>();
    a.pos = pos.data_ptr<int32_t>();
    a.out = out.data_ptr();
    check_status(mok_ep_combine_cuda(&a, stream_of(rows)), op);
#else
    TORCH_CHECK(false, op, " runs on CUDA only (on the CPU use the torch backend of mok.ep)");
#endif
    return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mok, m) {
    m.def("ep_dispatch(Tensor src, int src_div, Tensor dst, Tensor pos, Tensor eid, Tensor counts, Tensor table, "
          "int rank_base, int world, int capacity, int buf_bytes, int blocks, int timeout_us, int silent_rank) "
          "-> (Tensor recv, Tensor recv_eid, Tensor recv_counts)");
    m.def("ep_combine(Tensor rows, Tensor recv_counts, Tensor dst, Tensor pos, Tensor table, int rank_base, "
          "int world, int capacity, int buf_bytes, int blocks, int timeout_us, int silent_rank) -> Tensor");
    m.def("ep_error_ptr() -> int", &ep_error_ptr);
    m.def("ep_error_record(bool clear) -> int[]", &ep_error_record);
}

TORCH_LIBRARY_IMPL(mok, CPU, m) {
    m.impl("ep_dispatch", &ep_dispatch);
    m.impl("ep_combine", &ep_combine);
}

#ifdef MOK_WITH_CUDA
TORCH_LIBRARY_IMPL(mok, CUDA, m) {
    m.impl("ep_dispatch", &ep_dispatch);
    m.impl("ep_combine", &ep_combine);
}
#endif

}  // namespace mok
