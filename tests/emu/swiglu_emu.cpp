/*
 * The stand-alone SwiGLU kernels (csrc/cuda/swiglu/swiglu_kernels.cuh: forward, backward and the row-scaled
 * backward, chosen as the launcher chooses them) run on the CPU through cuda_emu.h and compared bit for bit with
 * the C core's mok_swiglu_forward / _backward / _scaled_backward; the row-scaled backward's per-row sums d_s (a
 * fixed-shape warp reduction on the GPU, the core's is serial) within rounding and bit for bit run to run. The
 * emulation's fast forms (__expf, __fdividef) are the IEEE operations, so this checks the kernels' indexing and
 * order of operations, not the device's approximations (test_ops.py's GPU cases do). Every dtype, bf16's 16-byte
 * and scalar paths, I not a multiple of 8, one row, row scales of zero and from padding or out-of-range rows,
 * small grids. Built and run by tests/test_swiglu_emu.py:
 *
 *     swiglu_emu SEED     prints one line per failure and "N passed, N failed"
 */
#include "cuda_emu.h"
#include "emu_check.h"

#include "emu_ops.h"
#include "swiglu/swiglu_kernels.cuh"
#include "mok_core.h"

#include <cmath>
#include <string>
#include <vector>

namespace {

using emu::Rng;

using emu::acc_at;
using emu::acc_bytes;
using emu::emulated;
using emu::name_of;
using emu::ran;
using emu::size_of;

/* elements of dt in [-6, 6): the sigmoid's whole range matters */
std::vector<uint8_t> random_elements(Rng& rng, mok_dtype dt, int64_t n, size_t pad) {
    return emu::random_elements(rng, dt, n, pad, -6.0, 6.0);
}

void plain_case(Rng& rng, mok_dtype dt, int64_t R, int64_t I, bool backward, size_t misalign) {
    const size_t es = size_of(dt);
    const int64_t N = backward ? 2 * I : I;
    std::vector<uint8_t> h = random_elements(rng, dt, R * 2 * I, misalign), d = random_elements(rng, dt, R * I, misalign);
    std::vector<uint8_t> want((size_t)(R * N) * es), got((size_t)(R * N) * es + misalign, 0xA5);
    const int st = backward ? mok_swiglu_backward(h.data() + misalign, d.data() + misalign, dt, I, 0, R, want.data())
                            : mok_swiglu_forward(h.data() + misalign, dt, I, 0, R, want.data());
    if (st != MOK_OK) throw std::runtime_error("core swiglu");
    mok_swiglu_args a;
    a.h = h.data() + misalign;
    a.d_act = backward ? d.data() + misalign : nullptr;
    a.dtype = dt;
    a.R = R;
    a.I = I;
    a.out = got.data() + misalign;
    char label[160];
    snprintf(label, sizeof label, "swiglu %s %s R=%lld I=%lld misalign=%zu device=%d", backward ? "backward" : "forward",
             name_of(dt), (long long)R, (long long)I, misalign, emu::device());
    if (!ran(label, [&] {
            return backward ? mok_swiglu_rows::swiglu_backward_run(&a, emulated())
                            : mok_swiglu_rows::swiglu_forward_run(&a, emulated());
        }))
        return;
    emu::expect_same_bytes(got.data() + misalign, want.data(), want.size(), std::string(label) + " out");
}

void scaled_case(Rng& rng, mok_dtype dt, int64_t R, int64_t I, size_t misalign) {
    const size_t es = size_of(dt), as = dt == MOK_F64 ? 8 : 4;
    const int64_t n_pairs = R + 3;
    std::vector<uint8_t> h = random_elements(rng, dt, R * 2 * I, misalign), dz = random_elements(rng, dt, R * I, misalign);
    std::vector<double> wv((size_t)n_pairs);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = i % 5 == 2 ? 0.0 : rng.uniform() * 2.0;
    const std::vector<uint8_t> w = acc_bytes(wv, dt);
    std::vector<int32_t> src((size_t)R), src_core((size_t)R);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t kind = rng.below(8);
        src[(size_t)r] = kind == 0 ? -1 : kind == 1 ? (int32_t)(n_pairs + rng.below(3)) : (int32_t)rng.below(n_pairs);
        src_core[(size_t)r] = src[(size_t)r] < n_pairs ? src[(size_t)r] : -1; /* the core refuses past n_pairs */
    }
    std::vector<uint8_t> dh_want((size_t)(R * 2 * I) * es), z_want((size_t)(R * I) * es), ds_want((size_t)R * as);
    if (mok_swiglu_scaled_backward(h.data() + misalign, dz.data() + misalign, dt, I, src_core.data(), w.data(), n_pairs,
                                   0, R, dh_want.data(), z_want.data(), ds_want.data()) != MOK_OK)
        throw std::runtime_error("core swiglu_scaled_backward");
    std::vector<uint8_t> dh(dh_want.size() + misalign, 0xA5), z(z_want.size() + misalign, 0xA5),
        ds1(ds_want.size(), 0xA5), ds2(ds_want.size(), 0x5A);
    mok_swiglu_scaled_backward_args a;
    a.h = h.data() + misalign;
    a.d_z = dz.data() + misalign;
    a.dtype = dt;
    a.R = R;
    a.I = I;
    a.src_of_row = src.data();
    a.w = w.data();
    a.n_pairs = n_pairs;
    a.d_h = dh.data() + misalign;
    a.z = z.data() + misalign;
    char label[160];
    snprintf(label, sizeof label, "swiglu scaled backward %s R=%lld I=%lld misalign=%zu device=%d", name_of(dt),
             (long long)R, (long long)I, misalign, emu::device());
    a.d_s = ds1.data();
    if (!ran(label, [&] { return mok_swiglu_rows::swiglu_scaled_backward_run(&a, emulated()); })) return;
    a.d_s = ds2.data();
    if (!ran(std::string(label) + " again", [&] { return mok_swiglu_rows::swiglu_scaled_backward_run(&a, emulated()); }))
        return;
    const std::string l(label);
    emu::expect_same_bytes(dh.data() + misalign, dh_want.data(), dh_want.size(), l + " d_h");
    emu::expect_same_bytes(z.data() + misalign, z_want.data(), z_want.size(), l + " z");
    emu::expect(ds1 == ds2, l + " d_s deterministic");
    bool close = true; /* |d_s| <= I * 6 * max |act|: within 2 I eps of that */
    for (int64_t r = 0; r < R; ++r) {
        const double g = acc_at(ds1, dt, r), v = acc_at(ds_want, dt, r);
        const double eps = dt == MOK_F64 ? 2.2e-16 : 1.2e-7;
        close = close && std::fabs(g - v) <= 2.0 * (double)I * eps * (double)I * 6.0 * 36.0;
    }
    emu::expect(close, l + " d_s");
}

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? strtoull(argv[1], nullptr, 10) : 1};
    for (int device : {0, 1}) { /* 132 SMs, or one: grid-stride loops with several items per thread / warp */
        emu::device() = device;
        for (mok_dtype dt : {MOK_BF16, MOK_F16, MOK_F32, MOK_F64})
            for (size_t misalign : {(size_t)0, size_of(dt)})
                for (const auto& s : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {3, 5}, {40, 72}, {130, 40}, {7, 264}}) {
                    plain_case(rng, dt, s.first, s.second, false, misalign);
                    plain_case(rng, dt, s.first, s.second, true, misalign);
                    scaled_case(rng, dt, s.first, s.second, misalign);
                }
    }
    return emu::finish();
}
