// Walsh-Hadamard rotation in runs of n (a power of two) of rows held in shared memory, with
// hadamard.comp's stages and arithmetic: stage h (1, 2, 4, ... n / 2) turns each pair (i, i + h)
// into (a + b, a - b). Pair q of a row's head_dim / 2 pairs at stage h starts at hadamard_pair.
#ifndef VKRT_HADAMARD_RUNS_GLSL
#define VKRT_HADAMARD_RUNS_GLSL

uint hadamard_pair(uint q, uint n, uint h) {
    const uint t = q % (n / 2u);
    return (q / (n / 2u)) * n + (t / h) * 2u * h + t % h;
}

// the runs of n of the head_dim values in the float array buf rotated in place, a pair an
// invocation (lid of WG) a stage; the caller scales them as they are stored
#define HADAMARD_RUNS(buf, n, head_dim, lid)                                                    \
    [[unroll]] for (uint hs_ = 0u; hs_ < HALVINGS(n); ++hs_) {                                 \
        const uint h_ = 1u << hs_;                                                             \
        barrier();                                                                             \
        for (uint q_ = (lid); q_ < (head_dim) / 2u; q_ += WG) {                                \
            const uint i_ = hadamard_pair(q_, n, h_);                                          \
            const float a_ = buf[i_], b_ = buf[i_ + h_];                                       \
            buf[i_] = a_ + b_;                                                                 \
            buf[i_ + h_] = a_ - b_;                                                            \
        }                                                                                      \
    }                                                                                          \
    barrier();

#endif
