// Shared by the IQ quants and MXFP4: their lookup tables (iq_tables.glsl, generated from gguf's)
// and the reads of them. Grid entries and codebook values are exact small numbers; signs flip
// the float's sign bit, exactly as gguf's multiplication by -1.
// A type names its grid (IQ_GRID) before including this and reads it through QGRID(i); the
// sign patterns of IQ2_XXS, IQ2_XS and IQ3_XXS (gguf's ksigns_iq2xs) are computed (QSIGNS).
// With QTABLES_SHARED (the tuning table's quant_tables_shared) the grid is read from a
// shared-memory copy that qinit() fills with constant indices, or from the grids' buffer
// (QTABLES_BUFFER): a compiler that lowers each dynamically indexed read of a constant array to a
// search (lavapipe's LLVM) builds the kernel in a second instead of minutes. The 4-bit codebook types
// (IQ4_NL, IQ4_XS, MXFP4) name theirs (IQ_CODEBOOK); with QCODEBOOK_SHARED (the tuning table's
// quant_codebook_shared) it is read from a shared copy of 16 floats instead of its vector.
#ifndef VKRT_QUANT_IQ_COMMON_GLSL
#define VKRT_QUANT_IQ_COMMON_GLSL
// value = a * raw: types.glsl defines their qget
#define QGET_SCALED 1
#include "access.glsl"
#include "iq_tables.glsl"

// byte i of a table of words
#define TBYTE(t, i) (((t)[(i) >> 2] >> (8u * ((i) & 3u))) & 0xFFu)

#if defined(QTABLES_SHARED) && defined(IQ_GRID)
#define QTABLES_GRIDS 1
#endif
#if defined(QCODEBOOK_SHARED) && defined(IQ_CODEBOOK)
#define QTABLES_CODEBOOK 1
#endif
#if defined(QTABLES_GRIDS) || defined(QTABLES_CODEBOOK)
#define QTABLES 1
#endif
#ifdef QTABLES_GRIDS
shared uint qgrid_s[IQ_GRID.length()];
#ifdef QTABLES_BUFFER
layout(set = 1, binding = 0) readonly buffer QTables { uvec4 qtables[]; };
#endif
#define QGRID(i) qgrid_s[i]
#else
#define QGRID(i) IQ_GRID[i]
#endif
// the sign byte of 7-bit pattern i: its bits and their parity in bit 7 (an even count of
// negative values), gguf's ksigns_iq2xs[i] without a table read
#define QSIGNS(i) ((i) | ((uint(bitCount(i)) & 1u) << 7))
#ifdef QTABLES_CODEBOOK
shared float qcodebook_s[16];   // IQ_CODEBOOK's 16 signed bytes as floats (QCODEBOOK_SHARED)
#endif
#ifdef QTABLES
// fills the shared copies: every invocation calls it first, in uniform control flow. With
// QTABLES_BUFFER the grid comes from the device's grid buffer (vkrt/pipeline/quant_tables.py:
// set 1, the same words from QGRID_BASE on, in 16-byte units), a share of 16-byte loads an
// invocation. Otherwise every invocation stores the same constants: the writes race only with
// equal values, and there is no branch (lavapipe builds 2048 stores under a one-invocation
// branch as per-lane stores: 20 s)
void qinit() {
#if defined(QTABLES_GRIDS) && defined(QTABLES_BUFFER)
    const uint n = gl_WorkGroupSize.x * gl_WorkGroupSize.y * gl_WorkGroupSize.z;
    for (uint i = gl_LocalInvocationIndex; 4u * i < IQ_GRID.length(); i += n) {
        const uvec4 v = qtables[QGRID_BASE + i];
        qgrid_s[4u * i] = v.x;
        qgrid_s[4u * i + 1u] = v.y;
        qgrid_s[4u * i + 2u] = v.z;
        qgrid_s[4u * i + 3u] = v.w;
    }
#elif defined(QTABLES_GRIDS)
    [[unroll]] for (uint i = 0u; i < IQ_GRID.length(); i++) {
        qgrid_s[i] = IQ_GRID[i];
    }
#endif
#ifdef QTABLES_CODEBOOK
    [[unroll]] for (uint i = 0u; i < 16u; i++) {
        qcodebook_s[i] = float(int(TBYTE(IQ_CODEBOOK, i) << 24) >> 24);
    }
#endif
    barrier();
}
#endif

// the four byte values of a grid word as floats
vec4 grid4(uint w) { return u8f(bytes4(w)); }

// v with the sign of element i flipped where bit i of s is set (higher bits of s are ignored)
vec4 flip4(vec4 v, uint s) {
    return uintBitsToFloat(floatBitsToUint(v) ^ ((uvec4(s) >> uvec4(0u, 1u, 2u, 3u)) << 31));
}

// signed bytes as floats
vec4 sbytes4(uvec4 b) { return vec4(ivec4(b << 24) >> 24); }

// the codebook values at four 4-bit indices. The 16 bytes are a vector, not an array: a vector's
// component picked by a variable index stays in registers (a select), where a dynamically indexed
// constant array is copied into each invocation's local memory (NVIDIA) or read from memory (ACO)
const uvec4 KV_IQ4NL = uvec4(kvalues_iq4nl[0], kvalues_iq4nl[1], kvalues_iq4nl[2], kvalues_iq4nl[3]);
const uvec4 KV_MXFP4 = uvec4(kvalues_mxfp4[0], kvalues_mxfp4[1], kvalues_mxfp4[2], kvalues_mxfp4[3]);
uint vbyte(uvec4 t, uint i) { return (t[i >> 2] >> (8u * (i & 3u))) & 0xFFu; }
vec4 codebook4(uvec4 t, uvec4 i) {
    return sbytes4(uvec4(vbyte(t, i.x), vbyte(t, i.y), vbyte(t, i.z), vbyte(t, i.w)));
}
#ifdef QTABLES_CODEBOOK   // the type's one codebook, from its shared copy: the same values
vec4 iq4nl4(uvec4 i) { return vec4(qcodebook_s[i.x], qcodebook_s[i.y], qcodebook_s[i.z], qcodebook_s[i.w]); }
#define mxfp4_4 iq4nl4
#else
vec4 iq4nl4(uvec4 i) { return codebook4(KV_IQ4NL, i); }
vec4 mxfp4_4(uvec4 i) { return codebook4(KV_MXFP4, i); }
#endif

#endif
