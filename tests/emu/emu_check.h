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

/* main()'s last line and exit status */
inline int finish() {
    printf("%d passed, %d failed\n", passed(), failed());
    return failed() ? 1 : 0;
}

}  // namespace emu

#endif /* MOK_TESTS_EMU_CHECK_H */
