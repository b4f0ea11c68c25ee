/*
 * The router's CUDA kernels (csrc/cuda/route/route_topk.cuh: top-k forward and the logits' gradient) run on the
 * CPU through cuda_emu.h and compared bit for bit with the C core's mok_route_topk / mok_route_topk_backward
 * (the core rounds every operation to the storage type and uses expf / exp, as the kernels do; the host's expf
 * stands in for the device's here): float and double; softmax and sigmoid scores; with and without a selection
 * bias; plain and group-limited top-k (DeepSeek-V3's n_group / topk_group); with and without renormalisation and
 * scaling; E from 1 to ROUTE_MAX_E, K = 1 to E; ties (logits from a few values: lower id first) and NaN logits;
 * one token per warp, and a small grid whose warps take several tokens (the scratch reused). Built and run by
 * tests/test_route_emu.py:
 *
 *     route_emu SEED     prints one line per failure and "N passed, N failed"
 */
#include "cuda_emu.h"
#include "emu_check.h"

#include "route/route_topk.cuh"
#include "mok_core.h"

#include <string>
#include <vector>

namespace {

using emu::Rng;

struct Case {
    int64_t T, E, K, n_group, topk_group;
    int score_func, renormalize, device; /* device 1: one SM, so warps take several tokens */
    bool bias, ties, nan;
    double scaling;
};

template <typename T>
void run_case(Rng& rng, const Case& c) {
    const mok_dtype dt = sizeof(T) == 4 ? MOK_F32 : MOK_F64;
    std::vector<T> logits((size_t)(c.T * c.E)), bias((size_t)c.E);
    for (auto& v : logits) v = c.ties ? (T)(rng.below(4) - 2) * (T)0.5 : (T)((rng.uniform() - 0.5) * 8.0);
    if (c.nan)
        for (int i = 0; i < 3; ++i) logits[(size_t)rng.below(c.T * c.E)] = (T)NAN;
    for (auto& v : bias) v = (T)((rng.uniform() - 0.5) * 0.2);
    char label[220];
    snprintf(label, sizeof label,
             "route %s T=%lld E=%lld K=%lld groups=%lld/%lld score=%d renorm=%d bias=%d ties=%d nan=%d scaling=%g "
             "device=%d", sizeof(T) == 4 ? "f32" : "f64", (long long)c.T, (long long)c.E, (long long)c.K,
             (long long)c.n_group, (long long)c.topk_group, c.score_func, c.renormalize, c.bias, c.ties, c.nan,
             c.scaling, c.device);
    const std::string l(label);

    /* forward: the core, then the kernel */
    std::vector<int32_t> idx((size_t)(c.T * c.K)), g_idx((size_t)(c.T * c.K), -7);
    std::vector<T> w((size_t)(c.T * c.K)), g_w((size_t)(c.T * c.K), (T)-7);
    if (mok_route_topk(logits.data(), c.bias ? bias.data() : nullptr, dt, c.T, c.E, c.K, c.score_func, c.n_group,
                       c.topk_group, c.renormalize, c.scaling, idx.data(), w.data()) != MOK_OK) {
        ++emu::failed();
        printf("FAIL %s: the core refused the case\n", label);
        return;
    }
    using namespace mok_route;
    route_params p;
    p.logits = logits.data();
    p.bias = c.bias ? bias.data() : nullptr;
    p.grad_w = nullptr;
    p.topk_idx_in = nullptr;
    p.T = c.T;
    p.E = c.E;
    p.K = c.K;
    p.score_func = c.score_func;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.renormalize = c.renormalize;
    p.scaling = c.scaling;
    p.topk_idx = g_idx.data();
    p.out = g_w.data();
    emu::device() = c.device;
    try {
        emu::launch(route_grid<T>(c.T), route_cfg<T>::WARPS * 32, [&] { route_topk_kernel<T>(p); });
    } catch (const std::exception& e) {
        ++emu::failed();
        printf("FAIL %s: %s\n", label, e.what());
        return;
    }
    emu::expect_same_bytes(g_idx.data(), idx.data(), idx.size() * 4, l + " topk_idx");
    emu::expect_same_bytes(g_w.data(), w.data(), w.size() * sizeof(T), l + " topk_w");

    /* backward for the core's selection, with random gradients of the weights */
    std::vector<T> gw((size_t)(c.T * c.K)), dl((size_t)(c.T * c.E)), g_dl((size_t)(c.T * c.E), (T)-7);
    for (auto& v : gw) v = (T)((rng.uniform() - 0.5) * 2.0);
    if (mok_route_topk_backward(gw.data(), logits.data(), idx.data(), dt, c.T, c.E, c.K, c.score_func, c.renormalize,
                                c.scaling, dl.data()) != MOK_OK) {
        ++emu::failed();
        printf("FAIL %s: the core refused the backward\n", label);
        return;
    }
    p.bias = nullptr;
    p.grad_w = gw.data();
    p.topk_idx_in = idx.data();
    p.n_group = 1;
    p.topk_group = 1;
    p.topk_idx = nullptr;
    p.out = g_dl.data();
    try {
        emu::launch(route_grid<T>(c.T), route_cfg<T>::WARPS * 32, [&] { route_topk_backward_kernel<T>(p); });
    } catch (const std::exception& e) {
        ++emu::failed();
        printf("FAIL %s backward: %s\n", label, e.what());
        return;
    }
    emu::expect_same_bytes(g_dl.data(), dl.data(), dl.size() * sizeof(T), l + " grad_logits");
}

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? strtoull(argv[1], nullptr, 10) : 1};
    auto random_case = [&](int64_t T, int64_t E, int64_t K, int64_t n_group, int64_t topk_group) {
        Case c;
        c.T = T;
        c.E = E;
        c.K = K;
        c.n_group = n_group;
        c.topk_group = topk_group;
        c.score_func = rng.below(2) ? MOK_SCORE_SIGMOID : MOK_SCORE_SOFTMAX;
        c.renormalize = (int)rng.below(2);
        c.device = (int)rng.below(2);
        c.bias = rng.below(2);
        c.ties = rng.below(3) == 0;
        c.nan = rng.below(6) == 0;
        c.scaling = rng.below(2) ? 1.0 : 2.5;
        return c;
    };
    /* plain top-k: E = 1, E < 32, E not a multiple of 32, the largest E; K = 1, K = E */
    const std::vector<std::pair<int64_t, int64_t>> ek = {{1, 1}, {8, 2}, {8, 8}, {60, 4}, {128, 8}, {257, 9}, {512, 1}};
    for (const auto& s : ek)
        for (int64_t T : {1, 5, 300}) {
            run_case<float>(rng, random_case(T, s.first, s.second, 1, 1));
            run_case<double>(rng, random_case(T, s.first, s.second, 1, 1));
        }
    /* group-limited: DeepSeek-V3's 256 / 8 groups / 4 kept / top-8, groups of one expert, all groups kept */
    for (int64_t T : {1, 37, 700}) {
        run_case<float>(rng, random_case(T, 256, 8, 8, 4));
        run_case<double>(rng, random_case(T, 64, 6, 8, 3));
        run_case<float>(rng, random_case(T, 16, 3, 16, 5));
        run_case<float>(rng, random_case(T, 96, 7, 4, 4));
    }
    return emu::finish();
}
