/*
 * The routing plan's CUDA kernels (csrc/cuda/plan/plan_build.cuh, launched in plan_build_launches' order) run on
 * the CPU through cuda_emu.h and compared with the C core's mok_plan_build: counts, offsets, row_of, src_of_row,
 * num_skipped and the error word, on random routings (uniform, all pairs to one expert, many empty experts),
 * T * K across chunk boundaries (0, 1, 255, 256, 257, a few thousand), E from 1 to more than the offsets
 * kernel's 1024 threads, tiles of 1, 8 and 128, spare capacity, and invalid expert ids skipped (counted) or
 * reported (the error word set, the pairs skipped as the core skips them). The workspace starts as garbage.
 * Built and run by tests/test_plan_emu.py:
 *
 *     plan_emu SEED     prints one line per failure and "N passed, N failed"
 */
#include "cuda_emu.h"
#include "emu_check.h"

#include "plan/plan_build.cuh"
#include "mok_core.h"

#include <string>
#include <vector>

namespace {

using emu::Rng;

enum Routing { kUniform, kOneExpert, kFewExperts };

/* One plan: ids drawn by `routing`, `invalid` of them outside [0, E) (negative or >= E) */
void run_case(Rng& rng, int64_t T, int64_t K, int64_t E, int64_t tile, Routing routing, int64_t invalid,
              bool skip_invalid, int64_t spare) {
    const int64_t TK = T * K;
    std::vector<int32_t> ids((size_t)TK);
    const int64_t hot = rng.below(E), few = 1 + rng.below(3);
    for (auto& id : ids)
        id = (int32_t)(routing == kOneExpert ? hot : routing == kFewExperts ? (hot + rng.below(few)) % E : rng.below(E));
    for (int64_t i = 0; i < invalid && TK > 0; ++i)
        ids[(size_t)rng.below(TK)] = rng.below(2) ? -1 - (int32_t)rng.below(5) : (int32_t)(E + rng.below(5));
    const int64_t capacity = mok_plan_capacity(T, K, E, tile) + spare;

    /* the core (reported ids: the CUDA plan skips them as the core's skip_invalid does, and sets the word) */
    std::vector<int32_t> counts((size_t)E), offsets((size_t)E + 1), row_of((size_t)TK), src((size_t)capacity),
        skipped(1);
    const int st = mok_plan_build(ids.data(), T, K, E, tile, capacity, 1, counts.data(), offsets.data(), row_of.data(),
                                  src.data(), skipped.data());
    char label[200];
    snprintf(label, sizeof label, "plan T=%lld K=%lld E=%lld tile=%lld routing=%d invalid=%lld skip=%d spare=%lld",
             (long long)T, (long long)K, (long long)E, (long long)tile, (int)routing, (long long)invalid, skip_invalid,
             (long long)spare);
    if (st != MOK_OK) {
        ++emu::failed();
        printf("FAIL %s: the core returned %d\n", label, st);
        return;
    }

    /* the kernels, outputs poisoned, the workspace garbage */
    using namespace mok_plan;
    const int64_t NC = (TK + PLAN_CHUNK - 1) / PLAN_CHUNK;
    std::vector<int32_t> g_counts((size_t)E, 0x5A5A5A5A), g_offsets((size_t)E + 1, 0x5A5A5A5A),
        g_row_of((size_t)TK, 0x5A5A5A5A), g_src((size_t)capacity, 0x5A5A5A5A), g_skipped(1, 0x5A5A5A5A),
        ws((size_t)(NC * E + 1));
    for (auto& w : ws) w = (int32_t)rng.next();
    int32_t error_word = 0;
    plan_params p;
    p.topk_idx = ids.data();
    p.TK = TK;
    p.E = E;
    p.NC = NC;
    p.tile = tile;
    p.capacity = capacity;
    p.skip_invalid = skip_invalid;
    p.counts = g_counts.data();
    p.offsets = g_offsets.data();
    p.row_of = g_row_of.data();
    p.src_of_row = g_src.data();
    p.num_skipped = g_skipped.data();
    p.ws = ws.data();
    p.error_flag = &error_word;
    try {
        plan_build_launches(p, [&](auto kernel, unsigned grid, unsigned block, auto... args) {
            emu::launch(grid, block, [&] { kernel(args...); });
        });
    } catch (const std::exception& e) {
        ++emu::failed();
        printf("FAIL %s: %s\n", label, e.what());
        return;
    }
    const std::string l(label);
    emu::expect_same(g_counts, counts, l + " counts");
    emu::expect_same(g_offsets, offsets, l + " offsets");
    emu::expect_same(g_row_of, row_of, l + " row_of");
    emu::expect_same(g_src, src, l + " src_of_row");
    emu::expect_same(g_skipped, skipped, l + " num_skipped");
    const bool report = skipped[0] > 0 && !skip_invalid;
    emu::expect(error_word == (report ? (int32_t)MOK_DEVICE_ERR_EXPERT_ID : 0), l + " error word");
}

}  // namespace

int main(int argc, char** argv) {
    Rng rng{argc > 1 ? strtoull(argv[1], nullptr, 10) : 1};
    /* T * K around the chunk size (256), K = 1, E = 1, E past one block's threads (256) and the offsets
     * kernel's (1024) */
    const std::vector<std::pair<int64_t, int64_t>> tk = {{0, 8}, {1, 1}, {1, 8}, {255, 1}, {32, 8}, {257, 1},
                                                         {100, 6}, {1 + rng.below(700), 1 + rng.below(8)}};
    for (const auto& s : tk)
        for (int64_t E : {1, 3, 128, 300})
            for (int64_t tile : {1, 8, 128})
                run_case(rng, s.first, s.second, E, tile, (Routing)rng.below(3), 0, false, rng.below(2) * 37);
    for (Routing r : {kUniform, kOneExpert, kFewExperts}) {
        run_case(rng, 512, 8, 64, 128, r, 0, false, 0);         /* 16 chunks */
        run_case(rng, 300, 4, 1500, 8, r, 0, false, 0);         /* E > 1024: two experts per offsets thread */
        run_case(rng, 2000, 2, 2100, 1, r, 0, false, 5);
    }
    /* invalid ids: skipped and counted, or reported (and skipped) */
    for (bool skip : {true, false}) {
        run_case(rng, 1, 1, 4, 1, kUniform, 1, skip, 0);
        run_case(rng, 257, 2, 16, 128, kUniform, 3, skip, 0);
        run_case(rng, 600, 8, 128, 8, kOneExpert, 40, skip, 11);
        run_case(rng, 100, 3, 2000, 128, kFewExperts, 7, skip, 0);
    }
    return emu::finish();
}
