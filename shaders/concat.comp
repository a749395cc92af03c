#version 450
// Generic concat along dimension `dim`: dst[i] = a[i] where i[dim] < split, else
// b[i - split along dim]; any strides (in elements), each source converted to the dst type.
// Defines: A_TYPE, A_BITS, B_TYPE, B_BITS, DST_TYPE, DST_BITS, STORAGE16.
#include "common.glsl"
#include "elements.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer A { RAW_T(A_BITS) a[]; };
layout(binding = 1) readonly buffer B { RAW_T(B_BITS) b[]; };
layout(binding = 2) WRITEONLY(DST_BITS) buffer Dst { RAW_T(DST_BITS) dst[]; };

layout(push_constant) uniform Push {
    uint n;
    uint ne0;
    uint ne1;
    uint ne2;
    uint dim;
    uint split;
    uint a_nb[4];
    uint b_nb[4];
    uint dst_nb[4];
    uint a_off;
    uint b_off;
    uint dst_off;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.n) {
        return;
    }
    const uint r = i / p.ne0;
    uvec4 idx = uvec4(i % p.ne0, r % p.ne1, (r / p.ne1) % p.ne2, (r / p.ne1) / p.ne2);
    const uint d = p.dst_off + idx.x * p.dst_nb[0] + idx.y * p.dst_nb[1] + idx.z * p.dst_nb[2] + idx.w * p.dst_nb[3];
    uint v;
    if (idx[p.dim] < p.split) {
        v = LOAD(A_BITS, a, p.a_off + idx.x * p.a_nb[0] + idx.y * p.a_nb[1] + idx.z * p.a_nb[2] + idx.w * p.a_nb[3]);
#if A_TYPE != DST_TYPE
        v = CONVERT(A_TYPE, DST_TYPE, v);
#endif
    } else {
        idx[p.dim] -= p.split;
        v = LOAD(B_BITS, b, p.b_off + idx.x * p.b_nb[0] + idx.y * p.b_nb[1] + idx.z * p.b_nb[2] + idx.w * p.b_nb[3]);
#if B_TYPE != DST_TYPE
        v = CONVERT(B_TYPE, DST_TYPE, v);
#endif
    }
    STORE(DST_BITS, dst, d, v);
}
