/*
 * What every CPU emulation program of tests/emu/ shares besides cuda_emu.h: its random numbers (splitmix64 from
 * the seed on the command line, so that a failing seed replays) and its count of passed and failed checks, which
 * main() prints last ("N passed, N failed", read by tests/emu_build.py) and turns into the exit status.
 */
#ifndef MOK_TESTS_EMU_CHECK_H
#define MOK_TESTS_EMU_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include <string>
#include <vector>

namespace emu {

struct Rng {
    uint64_t s;
    uint64_t next() {
        s += 0x9E3779B97F4A7C15ull;
        uint64_t z = s;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    /* in [0, n) */
    int64_t below(int64_t n) { return (int64_t)(next() % (uint64_t)n); }
    /* in [0, 1) */
    double uniform() { return (double)(next() >> 11) / 9007199254740992.0; }
};

inline int& passed() {
    static int n = 0;
    return n;
}
inline int& failed() {
    static int n = 0;
    return n;
}

/* One check: counted, and a line naming it when it fails. */
inline bool expect(bool ok, const std::string& what) {
    if (ok) {
        ++passed();
    } else {
        ++failed();
        printf("FAIL %s\n", what.c_str());
    }
    return ok;
}

/* `bytes` bytes of got and want the same: counted; a failure says how many differ and the first of them. */
inline bool expect_same_bytes(const void* got, const void* want, size_t bytes, const std::string& what) {
    const uint8_t *g = (const uint8_t*)got, *w = (const uint8_t*)want;
    size_t n = 0, first = 0;
    for (size_t i = 0; i < bytes; ++i)
        if (g[i] != w[i] && n++ == 0) first = i;
    if (n == 0) return expect(true, what);
    char detail[96];
    snprintf(detail, sizeof detail, ": %zu of %zu bytes differ, first at %zu: got %02x want %02x", n, bytes, first,
             g[first], w[first]);
    return expect(false, what + detail);
}

/* two vectors the same, sizes included */
template <typename T>
inline bool expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    if (got.size() != want.size()) return expect(false, what + ": sizes differ");
    return expect_same_bytes(got.data(), want.data(), got.size() * sizeof(T), what);
}

/* main()'s last line and exit status */
inline int finish() {
    printf("%d passed, %d failed\n", passed(), failed());
    return failed() ? 1 : 0;
}

}  // namespace emu

#endif /* MOK_TESTS_EMU_CHECK_H */
