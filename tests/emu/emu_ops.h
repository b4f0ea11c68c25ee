/*
 * What the emulation programs of whole operations (rows_emu.cpp, swiglu_emu.cpp) share: the core's dtypes as
 * bytes (sizes, names, random elements and accumulation-type values) and running a kernel family's *_run function
 * (its checks and launches) with every launch emulated. Include after cuda_emu.h and emu_check.h.
 */
#ifndef MOK_TESTS_EMU_OPS_H
#define MOK_TESTS_EMU_OPS_H

#include <stdint.h>
#include <string.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "mok_core.h"

namespace emu {

/* storage bytes of one element of dt, and its name */
inline size_t size_of(mok_dtype dt) { return dt == MOK_F64 ? 8 : dt == MOK_F32 ? 4 : 2; }
inline const char* name_of(mok_dtype dt) {
    return dt == MOK_BF16 ? "bf16" : dt == MOK_F16 ? "f16" : dt == MOK_F32 ? "f32" : "f64";
}

/* n random elements of dt, uniform in [lo, hi) before rounding to dt, as bytes after `pad` zero bytes */
inline std::vector<uint8_t> random_elements(Rng& rng, mok_dtype dt, int64_t n, size_t pad, double lo, double hi) {
    std::vector<uint8_t> b((size_t)n * size_of(dt) + pad, 0);
    for (int64_t i = 0; i < n; ++i) {
        const double v = lo + rng.uniform() * (hi - lo);
        uint8_t* at = b.data() + pad + (size_t)i * size_of(dt);
        if (dt == MOK_F64) {
            memcpy(at, &v, 8);
        } else if (dt == MOK_F32) {
            const float f = (float)v;
            memcpy(at, &f, 4);
        } else {
            const uint16_t h = dt == MOK_BF16 ? __bfloat16_as_ushort(__float2bfloat16((float)v))
                                              : __half_as_ushort(__float2half((float)v));
            memcpy(at, &h, 2);
        }
    }
    return b;
}

/* value i of an accumulation-type vector (double for f64, float otherwise) stored as bytes, and the reverse */
inline double acc_at(const std::vector<uint8_t>& b, mok_dtype dt, int64_t i) {
    if (dt == MOK_F64) {
        double v;
        memcpy(&v, b.data() + 8 * i, 8);
        return v;
    }
    float f;
    memcpy(&f, b.data() + 4 * i, 4);
    return f;
}
inline std::vector<uint8_t> acc_bytes(const std::vector<double>& v, mok_dtype dt) {
    std::vector<uint8_t> b(v.size() * (dt == MOK_F64 ? 8 : 4));
    for (size_t i = 0; i < v.size(); ++i) {
        if (dt == MOK_F64) {
            memcpy(b.data() + 8 * i, &v[i], 8);
        } else {
            const float f = (float)v[i];
            memcpy(b.data() + 4 * i, &f, 4);
        }
    }
    return b;
}

/* launch(kernel, grid, block, args...) as one emulated grid: what the *_run functions get here */
inline auto emulated() {
    return [](auto kernel, unsigned grid, unsigned block, auto... args) {
        emu::launch(grid, block, [&] { kernel(args...); });
    };
}

/* Runs one operation's checks and launches: false (a failure counted) when it refused its arguments or a
 * launch broke. */
template <class Run>
bool ran(const std::string& label, Run&& run) {
    try {
        return expect(run() == 0, label + " accepted");
    } catch (const std::exception& e) {
        return expect(false, label + ": " + e.what());
    }
}

}  // namespace emu

#endif /* MOK_TESTS_EMU_OPS_H */
