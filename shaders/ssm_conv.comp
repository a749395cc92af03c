#version 450
// Causal depthwise conv1d over the last K inputs of each channel, then SiLU (llama.cpp's
// ssm_conv + silu, the short convolution of Gated DeltaNet layers), with a conv state per sequence:
//   window = [state taps 0..K-2 (oldest first), x[c, the sequence's tokens...]]
//   y[c, t_i] = silu(sum_k w[k, c] * window[i + k]);  the state keeps the window's last K-1 values.
// Tokens are n_seqs runs of seq_len consecutive columns; sequence q's state is slot slots[q].
// An invocation owns (channel, chunk of one sequence's tokens) and walks them with the window in
// registers; it starts from the K-1 inputs before its chunk (from x, or the state for chunk 0).
// Only chunk 0's invocation touches the state: it reads the old taps before it writes the new
// ones (chunks are at least K-1 tokens long, so the other chunks read x alone).
#include "common.glsl"
#define ACT ACT_SILU
#include "act.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float x[]; };
layout(binding = 1) readonly buffer W { float w[]; };      // [K, C]: w[k, c] at c * K + k
layout(binding = 2) buffer S { float st[]; };              // tap j of channel c: c + j * s_s1 + slot * s_s2
layout(binding = 3) readonly buffer Slots { int slots[]; };
layout(binding = 4) writeonly buffer Y { float y[]; };

layout(push_constant) uniform Push {
    uint n;          // invocations: channels * n_chunks * n_seqs
    uint channels;
    uint seq_len;    // tokens of each sequence
    uint n_chunks;   // chunks of each sequence
    uint chunk;      // tokens of a chunk (>= K - 1)
    uint x_off;
    uint x_s1;
    uint y_off;
    uint y_s1;
    uint w_off;
    uint s_off;
    uint s_s1;
    uint s_s2;
    uint slot_off;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.n) {
        return;
    }
    const uint c = i % p.channels;
    const uint r = i / p.channels;
    const uint chunk = r % p.n_chunks;
    const uint q = r / p.n_chunks;
    const uint t0 = chunk * p.chunk;
    const uint t1 = min(t0 + p.chunk, p.seq_len);
    const uint xb = p.x_off + c + q * p.seq_len * p.x_s1;   // column 0 of the sequence
    const uint yb = p.y_off + c + q * p.seq_len * p.y_s1;
    const uint sb = p.s_off + c + uint(slots[p.slot_off + q]) * p.s_s2;

    float wk[K];
    [[unroll]] for (uint k = 0; k < K; ++k) {
        wk[k] = w[p.w_off + c * K + k];
    }
    float win[K - 1];   // the K-1 inputs before token t, oldest first
    if (t0 == 0) {
        [[unroll]] for (uint j = 0; j < K - 1; ++j) {
            win[j] = st[sb + j * p.s_s1];
        }
    } else {
        [[unroll]] for (uint j = 0; j < K - 1; ++j) {
            win[j] = x[xb + (t0 - (K - 1) + j) * p.x_s1];
        }
    }
    for (uint t = t0; t < t1; ++t) {
        const float v = x[xb + t * p.x_s1];
        float acc = 0.0;
        [[unroll]] for (uint k = 0; k < K - 1; ++k) {
            acc += wk[k] * win[k];
        }
        acc += wk[K - 1] * v;
        y[yb + t * p.y_s1] = act_fn(acc);
        [[unroll]] for (uint j = 0; j + 1 < K - 1; ++j) {
            win[j] = win[j + 1];
        }
        win[K - 2] = v;
    }
    if (t0 == 0 && t1 < p.seq_len) {   // more chunks follow: the new taps are x's last K-1 columns
        [[unroll]] for (uint j = 0; j < K - 1; ++j) {
            win[j] = x[xb + (p.seq_len - (K - 1) + j) * p.x_s1];
        }
    }
    if (t0 == 0) {
        [[unroll]] for (uint j = 0; j < K - 1; ++j) {
            st[sb + j * p.s_s1] = win[j];
        }
    }
}
