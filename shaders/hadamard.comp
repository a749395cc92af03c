#version 450
// In-place Walsh-Hadamard rotation of a KV cache's rows (llama.cpp's attn_rot_k / attn_rot_v):
// each run of N consecutive elements of a row becomes H·x / sqrt(N), H the Sylvester-ordered
// Hadamard matrix of llama.cpp's ggml_gen_hadamard (symmetric; applied twice it gives x back).
// x f32 [ne0, ne1, ne2] with contiguous rows, addressed x_off + i1 * s1 + i2 * s2 (floats).
// A workgroup of N / 2 invocations a run: log2(N) butterfly stages in shared memory.
#include "common.glsl"

layout(local_size_x = HALF) in;

layout(binding = 0) buffer X { float x[]; };

layout(push_constant) uniform Push {
    uint runs;    // ne0 / N
    uint ne1;
    uint n;       // runs * ne1 * ne2
    uint x_off;
    uint s1;
    uint s2;
    float scale;  // 1 / sqrt(N)
} p;

shared float sh[2 * HALF];

void main() {
    const uint g = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (g >= p.n) {
        return;
    }
    const uint r = g % p.runs, i1 = (g / p.runs) % p.ne1, i2 = g / (p.runs * p.ne1);
    const uint base = p.x_off + i2 * p.s2 + i1 * p.s1 + r * 2u * HALF;
    const uint t = gl_LocalInvocationID.x;
    sh[t] = x[base + t];
    sh[t + HALF] = x[base + t + HALF];
    [[unroll]] for (uint h = 1u; h < 2u * HALF; h <<= 1) {
        barrier();
        const uint i = (t / h) * 2u * h + t % h;
        const float a = sh[i], b = sh[i + h];
        sh[i] = a + b;
        sh[i + h] = a - b;
    }
    barrier();
    x[base + t] = sh[t] * p.scale;
    x[base + t + HALF] = sh[t + HALF] * p.scale;
}
