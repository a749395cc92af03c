#version 450
// dst[i0,i1,i2,i3] = convert(src[i0,i1,i2,i3]); strides and offsets in elements.
// Defines: SRC_TYPE, SRC_BITS, DST_TYPE, DST_BITS, STORAGE16 (see elements.glsl).
#include "common.glsl"
#include "elements.glsl"

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer Src { RAW_T(SRC_BITS) src[]; };
layout(binding = 1) WRITEONLY(DST_BITS) buffer Dst { RAW_T(DST_BITS) dst[]; };

layout(push_constant) uniform Push {
    uint n;
    uint ne0;
    uint ne1;
    uint ne2;
    uint src_nb[4];
    uint dst_nb[4];
    uint src_off;
    uint dst_off;
} p;

void main() {
    const uint i = global_index();
    if (i >= p.n) {
        return;
    }
    const uint i0 = i % p.ne0;
    const uint r = i / p.ne0;
    const uint i1 = r % p.ne1;
    const uint i2 = (r / p.ne1) % p.ne2;
    const uint i3 = (r / p.ne1) / p.ne2;
    const uint s = p.src_off + i0 * p.src_nb[0] + i1 * p.src_nb[1] + i2 * p.src_nb[2] + i3 * p.src_nb[3];
    const uint d = p.dst_off + i0 * p.dst_nb[0] + i1 * p.dst_nb[1] + i2 * p.dst_nb[2] + i3 * p.dst_nb[3];
    uint v = LOAD(SRC_BITS, src, s);
#if SRC_TYPE != DST_TYPE
    v = CONVERT(SRC_TYPE, DST_TYPE, v);
#endif
    STORE(DST_BITS, dst, d, v);
}
