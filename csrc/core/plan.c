/* Routing plan: expert-ordered, tile-padded row space for the (token, k) pairs. */
#include "internal.h"

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* Negative arguments or tile < 1 give -1 (not a valid capacity). */
int64_t mok_plan_capacity(int64_t T, int64_t K, int64_t E, int64_t tile) {
    int64_t pairs;
    if (T < 0 || K < 0 || E < 0 || tile < 1) return -1;
    pairs = T * K;
    if (pairs == 0) return 0;
    return round_up(pairs + mok_min64(E, pairs) * (tile - 1), tile);
}

static int check_plan_args(const int32_t* topk_idx, int64_t T, int64_t K, int64_t E, int64_t tile, int64_t capacity,
                           const int32_t* counts, const int32_t* offsets, const int32_t* row_of,
                           const int32_t* src_of_row) {
    int64_t pairs = T * K;
    if (T < 0 || K < 0 || E < 0 || tile < 1 || capacity < 0) return MOK_ERR_ARG;
    /* rows and t * K + k are stored as int32 */
    if (pairs > INT32_MAX || capacity > INT32_MAX || E > INT32_MAX - 1) return MOK_ERR_ARG;
    if (!offsets || (E > 0 && !counts) || (capacity > 0 && !src_of_row)) return MOK_ERR_ARG;
    if (pairs > 0 && (!topk_idx || !row_of)) return MOK_ERR_ARG;
    if (capacity < mok_plan_capacity(T, K, E, tile)) return MOK_ERR_CAPACITY;
    return MOK_OK;
}

/* counts[e] = pairs routed to e; the number of invalid ids goes to *skipped. */
static int count_pairs(const int32_t* topk_idx, int64_t pairs, int64_t E, int skip_invalid, int32_t* counts,
                       int64_t* skipped) {
    int64_t i;
    for (i = 0; i < E; i++) counts[i] = 0;
    *skipped = 0;
    for (i = 0; i < pairs; i++) {
        int32_t e = topk_idx[i];
        if (e >= 0 && e < E) counts[e]++;
        else if (skip_invalid) (*skipped)++;
        else return MOK_ERR_EXPERT_ID;
    }
    return MOK_OK;
}

/* num_skipped may be NULL. Outputs are unspecified when an error is returned. */
int mok_plan_build(const int32_t* topk_idx, int64_t T, int64_t K, int64_t E, int64_t tile, int64_t capacity,
                   int skip_invalid, int32_t* counts, int32_t* offsets, int32_t* row_of, int32_t* src_of_row,
                   int32_t* num_skipped) {
    int64_t i, e, pairs = T * K, skipped;
    int st = check_plan_args(topk_idx, T, K, E, tile, capacity, counts, offsets, row_of, src_of_row);
    if (st != MOK_OK) return st;
    st = count_pairs(topk_idx, pairs, E, skip_invalid, counts, &skipped);
    if (st != MOK_OK) return st;
    offsets[0] = 0;
    for (e = 0; e < E; e++) offsets[e + 1] = (int32_t)(offsets[e] + round_up(counts[e], tile));
    for (i = 0; i < capacity; i++) src_of_row[i] = -1;
    /* counts doubles as the per-expert fill cursor; scanning pairs in increasing t * K + k keeps
     * each expert's rows in that order, and the cursor ends equal to the count again. */
    for (e = 0; e < E; e++) counts[e] = 0;
    for (i = 0; i < pairs; i++) {
        int32_t x = topk_idx[i];
        if (x < 0 || x >= E) {
            row_of[i] = -1;
            continue;
        }
        row_of[i] = offsets[x] + counts[x]++;
        src_of_row[row_of[i]] = (int32_t)i;
    }
    if (num_skipped) *num_skipped = (int32_t)skipped;
    return MOK_OK;
}
